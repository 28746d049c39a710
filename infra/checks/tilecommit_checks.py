"""The project's own checkov checks for Bicep, for what checkov's built-in checks do not cover.

Run with ``checkov -d infra --framework bicep --external-checks-dir infra/checks``.
``tests/test_infra_checkov.py`` runs them on ``infra/`` (all must pass) and on
``tests/fixtures/infra_broken/`` plus mutated copies of ``infra/`` (each must fail).

checkov hands a check the resource as parsed by pycep, with variables and parameter defaults
rendered in where it can. Values it cannot evaluate stay as pycep expression trees:
``{"function": {"type": ..., "parameters": {...}}}`` and
``{"operator": {"type": ..., "operands": {...}}}``. The checks read through the two shapes that
matter here (``cond ? a : b`` and ``concat(...)``, each branch checked) and fail closed when
app settings cannot be seen at all: a check that cannot see a secret has not shown there is none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from checkov.bicep.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

# --------------------------------------------------------------------------------------------
# Reading pycep values
# --------------------------------------------------------------------------------------------


def _operator(value: Any) -> tuple[str | None, dict[str, Any]]:
    if isinstance(value, dict) and isinstance(value.get("operator"), dict):
        op = value["operator"]
        return op.get("type"), op.get("operands") or {}
    return None, {}


def _function(value: Any) -> tuple[str | None, dict[str, Any]]:
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        fn = value["function"]
        return fn.get("type"), fn.get("parameters") or {}
    return None, {}


def alternatives(value: Any) -> list[Any]:
    """The values an expression can take: both branches of a conditional, else the value itself."""
    op, operands = _operator(value)
    if op == "conditional":
        return alternatives(operands.get("true_value")) + alternatives(operands.get("false_value"))
    return [value]


def setting_lists(value: Any) -> list[list[Any]] | None:
    """Every list of ``{name, value}`` app settings an ``appSettings`` expression can produce.

    ``None`` when some alternative cannot be read (an unrendered parameter, a loop, an unknown
    function): the caller then fails closed.
    """
    results: list[list[Any]] = []
    for alt in alternatives(value):
        if isinstance(alt, list):
            results.append(alt)
            continue
        fn, params = _function(alt)
        if fn in ("concat", "union"):
            combos: list[list[Any]] = [[]]
            for key in sorted(params, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
                parts = setting_lists(params[key])
                if parts is None:
                    return None
                combos = [c + p for c in combos for p in parts]
            results.extend(combos)
            continue
        return None
    return results


def iter_strings(value: Any) -> Iterator[str]:
    """Every string inside a value or expression tree (keys excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from iter_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from iter_strings(item)


def calls_list_function(value: Any) -> bool:
    """True when the expression calls listKeys/listAccountSas/... (they return secrets)."""
    if isinstance(value, dict):
        fn, params = _function(value)
        if fn == "list_func":
            return True
        op, operands = _operator(value)
        if op == "function_accessor" and str(operands.get("func_name", "")).lower().startswith("list"):
            return True
        return any(calls_list_function(item) for item in value.values())
    if isinstance(value, list):
        return any(calls_list_function(item) for item in value)
    if isinstance(value, str):
        # Inside an interpolated string: '${storage.listKeys().keys[0].value}'.
        return re.search(r"\$\{[^}]*\blist\w*\(", value) is not None
    return False


def is_false(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.lower() == "false")


def is_true(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def get_path(conf: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(conf, dict):
            return None
        conf = conf.get(key)
    return conf


def resource_body(conf: dict[str, Any]) -> dict[str, Any]:
    """The resource body, also for ``[for x in xs: {...}]`` and ``if (cond) {...}`` resources."""
    if "loop_type" in conf or ("condition" in conf and isinstance(conf.get("config"), dict)):
        return resource_body(conf["config"])
    return conf


def is_function_app(conf: dict[str, Any]) -> bool:
    return any("functionapp" in kind.lower() for kind in iter_strings(conf.get("kind")))


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


class StorageSharedKeyAccessDisabled(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Storage account has shared key (account key and SAS) access disabled",
            id="CKV_TILECOMMIT_1",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Storage/storageAccounts",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        self.evaluated_keys = ["properties/allowSharedKeyAccess"]
        # Unset means allowed: only an explicit false passes.
        value = get_path(resource_body(conf), "properties", "allowSharedKeyAccess")
        return CheckResult.PASSED if is_false(value) else CheckResult.FAILED


class StorageNoPublicBlobAccess(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="No anonymous (public) blob access on the account or any container",
            id="CKV_TILECOMMIT_2",
            categories=(CheckCategories.GENERAL_SECURITY,),
            supported_resources=(
                "Microsoft.Storage/storageAccounts",
                "Microsoft.Storage/storageAccounts/blobServices/containers",
            ),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = resource_body(conf)
        if self.entity_type == "Microsoft.Storage/storageAccounts":
            self.evaluated_keys = ["properties/allowBlobPublicAccess"]
            value = get_path(body, "properties", "allowBlobPublicAccess")
            return CheckResult.PASSED if is_false(value) else CheckResult.FAILED
        self.evaluated_keys = ["properties/publicAccess"]
        value = get_path(body, "properties", "publicAccess")
        if value is None:
            return CheckResult.PASSED  # the default is None (private)
        values = alternatives(value)
        if all(isinstance(v, str) and v.lower() == "none" for v in values):
            return CheckResult.PASSED
        return CheckResult.FAILED


class FunctionAppManagedIdentity(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Function app has a managed identity and its host storage connection uses it",
            id="CKV_TILECOMMIT_3",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Web/sites",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = resource_body(conf)
        if not is_function_app(body):
            return CheckResult.UNKNOWN
        self.evaluated_keys = ["identity", "properties/siteConfig/appSettings"]
        identity_type = get_path(body, "identity", "type")
        if not isinstance(identity_type, str):
            return CheckResult.FAILED
        kinds = {part.strip().lower() for part in identity_type.split(",")}
        if not kinds & {"systemassigned", "userassigned"}:
            return CheckResult.FAILED
        if "userassigned" in kinds:
            assigned = get_path(body, "identity", "userAssignedIdentities")
            if not isinstance(assigned, dict) or not assigned:
                return CheckResult.FAILED
        lists = setting_lists(get_path(body, "properties", "siteConfig", "appSettings"))
        if lists is None:
            return CheckResult.FAILED
        for settings in lists:
            by_name = {
                str(entry.get("name", "")).lower(): entry.get("value") for entry in settings if isinstance(entry, dict)
            }
            credential = by_name.get("azurewebjobsstorage__credential")
            if not (isinstance(credential, str) and credential.lower() == "managedidentity"):
                return CheckResult.FAILED
            # With only a user-assigned identity the host must be told which one to use.
            if "systemassigned" not in kinds and "azurewebjobsstorage__clientid" not in by_name:
                return CheckResult.FAILED
        return CheckResult.PASSED


# Names that hold a key or a connection string whatever their value: the host storage connection
# as a string (it must be identity-based), Azure Files for the content share (keys only), the
# legacy instrumentation-key setting.
SECRET_SETTING_NAMES = {
    "azurewebjobsstorage",
    "azurewebjobsdashboard",
    "website_contentazurefileconnectionstring",
    "appinsights_instrumentationkey",
}
SECRET_NAME_PATTERN = re.compile(
    r"(__accountkey|__sharedaccesskey|__clientsecret|__connectionstring|accountkey|password|"
    r"secret|sastoken|sas_token|connection_?string)",
    re.IGNORECASE,
)
# Identifies an Application Insights component and cannot authenticate on its own when the
# component has local auth disabled (CKV_TILECOMMIT_5).
ALLOWED_SETTING_NAMES = {"applicationinsights_connection_string"}
# Two kinds of setting pass despite a name that says connection string (their values are still
# checked for keys below): one that names another setting (a host.json override such as
# ...__storageProvider__connectionStringName, whose value is that setting's name, checked itself),
# and a connection string that names an identity instead of holding a secret: the Durable Task
# Scheduler's (Endpoint=...;Authentication=ManagedIdentity;ClientID=...), a service that takes
# Entra ID only.
SETTING_REFERENCE_PATTERN = re.compile(r"(connectionStringName|connectionName)$", re.IGNORECASE)
IDENTITY_CONNECTION_PATTERN = re.compile(r";\s*Authentication=ManagedIdentity\b", re.IGNORECASE)
SECRET_VALUE_PATTERN = re.compile(
    r"(AccountKey=|SharedAccessSignature|SharedAccessKey|InstrumentationKey=|"
    r"DefaultEndpointsProtocol=|[?&]sig=)",
    re.IGNORECASE,
)


def secret_looking(name: Any, value: Any) -> bool:
    name_text = str(name)
    lowered = name_text.lower()
    if lowered in SECRET_SETTING_NAMES:
        return True
    not_a_secret = SETTING_REFERENCE_PATTERN.search(name_text) or any(
        IDENTITY_CONNECTION_PATTERN.search(text) for text in iter_strings(value)
    )
    if lowered not in ALLOWED_SETTING_NAMES and SECRET_NAME_PATTERN.search(name_text) and not not_a_secret:
        return True
    if any(SECRET_VALUE_PATTERN.search(text) for text in iter_strings(value)):
        return True
    return calls_list_function(value)


class NoSecretAppSettings(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="No keys, SAS tokens or connection strings in app settings",
            id="CKV_TILECOMMIT_4",
            categories=(CheckCategories.SECRETS,),
            supported_resources=("Microsoft.Web/sites", "Microsoft.Web/sites/config"),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = resource_body(conf)
        if self.entity_type == "Microsoft.Web/sites/config":
            self.evaluated_keys = ["properties"]
            name = str(body.get("name", "")).lower()
            if name.endswith("connectionstrings"):
                return CheckResult.FAILED
            if not name.endswith("appsettings"):
                return CheckResult.UNKNOWN
            properties = body.get("properties")
            if not isinstance(properties, dict):
                return CheckResult.FAILED
            bad = any(secret_looking(key, value) for key, value in properties.items())
            return CheckResult.FAILED if bad else CheckResult.PASSED

        self.evaluated_keys = ["properties/siteConfig/appSettings", "properties/siteConfig/connectionStrings"]
        site_config = get_path(body, "properties", "siteConfig")
        if not isinstance(site_config, dict):
            return CheckResult.PASSED if site_config is None else CheckResult.FAILED
        if site_config.get("connectionStrings"):
            return CheckResult.FAILED
        app_settings = site_config.get("appSettings")
        if app_settings is None:
            return CheckResult.PASSED
        lists = setting_lists(app_settings)
        if lists is None:
            return CheckResult.FAILED
        for settings in lists:
            for entry in settings:
                if not isinstance(entry, dict):
                    return CheckResult.FAILED
                if secret_looking(entry.get("name", ""), entry.get("value")):
                    return CheckResult.FAILED
        return CheckResult.PASSED


class MonitoringLocalAuthDisabled(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Application Insights and Log Analytics accept Entra ID only (local auth disabled)",
            id="CKV_TILECOMMIT_5",
            categories=(CheckCategories.IAM,),
            supported_resources=("Microsoft.Insights/components", "Microsoft.OperationalInsights/workspaces"),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        body = resource_body(conf)
        if self.entity_type == "Microsoft.Insights/components":
            self.evaluated_keys = ["properties/DisableLocalAuth"]
            value = get_path(body, "properties", "DisableLocalAuth")
        else:
            self.evaluated_keys = ["properties/features/disableLocalAuth"]
            value = get_path(body, "properties", "features", "disableLocalAuth")
        return CheckResult.PASSED if is_true(value) else CheckResult.FAILED


class StableApiVersion(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="Resource uses a stable (non-preview) API version",
            id="CKV_TILECOMMIT_6",
            categories=(CheckCategories.CONVENTION,),
            # Every resource: this check also shows, resource by resource, that checkov saw it.
            supported_resources=("*",),
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        # Preview API versions change shape and get retired; a deployment should not depend on one.
        self.evaluated_keys = ["api_version"]
        version = str(self.api_version or "")
        return CheckResult.PASSED if re.fullmatch(r"\d{4}-\d{2}-\d{2}", version) else CheckResult.FAILED


storage_shared_key_access_disabled = StorageSharedKeyAccessDisabled()
storage_no_public_blob_access = StorageNoPublicBlobAccess()
function_app_managed_identity = FunctionAppManagedIdentity()
no_secret_app_settings = NoSecretAppSettings()
monitoring_local_auth_disabled = MonitoringLocalAuthDisabled()
stable_api_version = StableApiVersion()
