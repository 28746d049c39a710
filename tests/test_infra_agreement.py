"""The templates and the app agree: a rename on one side fails here until the other follows.

Names come from tilecommit.settings (the code's single place for them); the templates are read
with tree-sitter-bicep (tests/test_infra_parse.py's `Bicep`) and evaluated for each hosting plan,
so both the Flex Consumption and the Consumption app settings are checked.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.bicep import INFRA, REPO_ROOT, Bicep, Unresolved
from tilecommit import settings
from tilecommit.storage import StorageConnection

MAIN = Bicep(INFRA / "main.bicep")
STORAGE = Bicep(INFRA / "modules" / "storage.bicep")
SUBSCRIPTION = Bicep(INFRA / "modules" / "event-subscription.bicep")
PLANS = MAIN.evaluate(MAIN.params["hostingPlan"].decorators["allowed"][0])


def module_params(name: str, plan: str) -> dict[str, Any]:
    return MAIN.property(MAIN.evaluate(MAIN.modules[name].value, {"hostingPlan": plan}), "params")


#: Plausible values for what is only known once deployed (module outputs, identities' ids).
STAND_INS = {
    "storage.outputs.blobEndpoint": "https://stexample.blob.core.windows.net/",
    "storage.outputs.queueEndpoint": "https://stexample.queue.core.windows.net/",
    "storage.outputs.tableEndpoint": "https://stexample.table.core.windows.net/",
    "monitoring.outputs.connectionString": "InstrumentationKey=00000000-0000-0000-0000-000000000002",
    "identity.properties.clientId": "00000000-0000-0000-0000-000000000001",
    "dataIdentity.properties.clientId": "00000000-0000-0000-0000-000000000003",
}


def with_stand_ins(deployed: dict[str, Any]) -> dict[str, str]:
    """The app settings as the app would read them: what deployment decides, a stand-in."""
    return {
        name: STAND_INS.get(value.text, str(value)) if isinstance(value, Unresolved) else str(value)
        for name, value in deployed.items()
    }


def app_settings(plan: str, **params: Any) -> dict[str, Any]:
    """The function app's app settings, name -> value, as deployed on `plan` (with `params`)."""
    site = MAIN.resources["functionApp"]
    assert site.type_or_path.startswith("Microsoft.Web/sites@")
    body = MAIN.evaluate(site.value, {"hostingPlan": plan, **params})
    entries = MAIN.property(body, "properties", "siteConfig", "appSettings")
    assert isinstance(entries, list), f"appSettings on {plan} cannot be read: {entries}"
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate app settings on {plan}"
    return {entry["name"]: entry["value"] for entry in entries}


def test_both_hosting_plans_are_offered_flex_first() -> None:
    assert PLANS == ["FlexConsumption", "Consumption"]
    assert MAIN.evaluate(MAIN.params["hostingPlan"].value) == "FlexConsumption"
    assert MAIN.evaluate(MAIN.params["instanceMemoryMB"].value) == 2048


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        ("inputContainerName", settings.INPUT_CONTAINER),
        ("tilesContainerName", settings.TILES_CONTAINER),
        ("outputContainerName", settings.OUTPUT_CONTAINER),
        ("manifestTableName", settings.MANIFEST_TABLE),
        ("triggerFunctionName", settings.TRIGGER_FUNCTION),
    ],
)
def test_template_names_are_the_codes_names(variable: str, expected: str) -> None:
    assert MAIN.evaluate(MAIN.vars[variable].value) == expected


@pytest.mark.parametrize("plan", PLANS)
def test_storage_creates_the_codes_containers_and_tables(plan: str) -> None:
    params = module_params("storage", plan)
    containers = params["containerNames"]
    tables = params["tableNames"]
    for name in (settings.INPUT_CONTAINER, settings.TILES_CONTAINER, settings.OUTPUT_CONTAINER):
        assert name in containers
    assert settings.MANIFEST_TABLE in tables
    # ... and the module really makes one container / table per name it is given.
    (container_resource,) = STORAGE.resources_of_type("Microsoft.Storage/storageAccounts/blobServices/containers")
    (table_resource,) = STORAGE.resources_of_type("Microsoft.Storage/storageAccounts/tableServices/tables")
    assert STORAGE.text(container_resource.loop_over) == "containerNames"
    assert STORAGE.text(table_resource.loop_over) == "tableNames"


@pytest.mark.parametrize("plan", PLANS)
def test_every_setting_the_code_reads_is_set_with_its_default(plan: str) -> None:
    deployed = app_settings(plan)
    missing = [name for name in settings.APP_SETTINGS if name not in deployed]
    assert missing == [], f"app settings the code reads but {plan} does not set"
    # No leftover TILECOMMIT_* setting that the code no longer reads.
    unknown = [n for n in deployed if n.startswith("TILECOMMIT_") and n not in settings.APP_SETTINGS]
    assert unknown == []
    values = {name: deployed[name] for name in settings.APP_SETTINGS}
    # The one setting without a default: the completion events' topic, known once it is deployed.
    topic = values.pop(settings.SETTING_EVENTS_ENDPOINT)
    assert isinstance(topic, Unresolved) and topic.text == "completionEvents.outputs.endpoint"
    unresolved = {n: v for n, v in values.items() if not isinstance(v, str)}
    assert unresolved == {}, "app settings whose value the test cannot compute"
    # The one setting that follows the plan: the instance's memory (Consumption's is fixed).
    memory = values.pop(settings.SETTING_INSTANCE_MEMORY_MB)
    assert memory == ("2048" if plan == "FlexConsumption" else "1536")
    assert settings.DEFAULT_INSTANCE_MEMORY_MB == 2048
    # The code reads the others back to exactly its own defaults.
    assert settings.Settings.from_env(values) == settings.Settings()


@pytest.mark.parametrize("plan", PLANS)
def test_gdal_cache_follows_the_apps_setting(plan: str) -> None:
    deployed = app_settings(plan)
    assert deployed["GDAL_CACHEMAX"] == deployed[settings.SETTING_GDAL_CACHEMAX]
    assert deployed["GDAL_DISABLE_READDIR_ON_OPEN"] == "EMPTY_DIR"


@pytest.mark.parametrize("plan", PLANS)
def test_storage_connection_is_identity_based_and_the_code_reads_it(plan: str) -> None:
    deployed = app_settings(plan)
    prefix = settings.STORAGE_CONNECTION
    assert prefix not in deployed, "a plain connection string: the connection must be identity-based"
    for suffix in ("blobServiceUri", "queueServiceUri", "tableServiceUri", "credential", "clientId"):
        assert f"{prefix}__{suffix}" in deployed
    assert deployed[f"{prefix}__credential"] == "managedidentity"
    # The deployed values are module outputs; give them plausible values and let the app read them.
    for name, value in deployed.items():
        if isinstance(value, Unresolved):
            assert value.text in STAND_INS or not name.startswith(prefix), f"{name} = {value}"
    environ = with_stand_ins(deployed)
    connection = StorageConnection.from_env(environ=environ)
    assert connection.connection_string is None
    assert connection.blob_endpoint == "https://stexample.blob.core.windows.net"
    assert connection.table_endpoint == "https://stexample.table.core.windows.net"
    assert connection.queue_endpoint == "https://stexample.queue.core.windows.net"
    assert connection.client_id == STAND_INS["identity.properties.clientId"]
    assert connection.account_name == "stexample"
    # The task hub is host.json's (settings.TASK_HUB); an app setting may only repeat it.
    for name, value in deployed.items():
        if name.lower().endswith("__durabletask__hubname"):
            assert value == settings.TASK_HUB


def test_event_grid_subscription_targets_the_trigger_function() -> None:
    params = module_params("eventSubscription", "FlexConsumption")
    assert params["triggerFunctionName"] == settings.TRIGGER_FUNCTION
    assert params["inputContainerName"] == settings.INPUT_CONTAINER
    assert MAIN.evaluate(MAIN.modules["eventSubscription"].condition) is False  # step 2 of deploy.sh
    assert MAIN.evaluate(MAIN.modules["eventSubscription"].condition, {"deployEventSubscription": True}) is True

    (subscription,) = SUBSCRIPTION.resources_of_type("Microsoft.EventGrid/systemTopics/eventSubscriptions")
    body = SUBSCRIPTION.evaluate(subscription.value, params)
    endpoint = SUBSCRIPTION.property(body, "properties", "destination")
    assert endpoint["endpointType"] == "WebHook"
    url = endpoint["properties"]["endpointUrl"]
    assert re.fullmatch(
        r"https://\{functionApp\.properties\.defaultHostName\}/runtime/webhooks/blobs"
        rf"\?functionName=Host\.Functions\.{re.escape(settings.TRIGGER_FUNCTION)}"
        r"&code=\{hostKeys\.listKeys\(\)\.systemKeys\.blobs_extension\}",
        url,
    ), url
    event_filter = SUBSCRIPTION.property(body, "properties", "filter")
    assert event_filter["includedEventTypes"] == ["Microsoft.Storage.BlobCreated"]
    assert event_filter["subjectBeginsWith"] == f"/blobServices/default/containers/{settings.INPUT_CONTAINER}/"


@pytest.mark.parametrize(
    ("plan", "given", "version"),
    [
        ("FlexConsumption", "", "3.13"),  # the plan's: the worker of azure-functions-runtime
        ("FlexConsumption", "3.11", "3.11"),
        ("Consumption", "", "3.11"),
    ],
)
def test_python_runtime_follows_the_plan_or_the_parameter(plan: str, given: str, version: str) -> None:
    body = MAIN.evaluate(MAIN.resources["functionApp"].value, {"hostingPlan": plan, "pythonVersion": given})
    properties = body["properties"]
    if plan == "FlexConsumption":
        assert properties["functionAppConfig"]["runtime"] == {"name": "python", "version": version}
        assert properties["siteConfig"]["linuxFxVersion"] is None
        assert "FUNCTIONS_WORKER_RUNTIME" not in app_settings(plan)  # replaced by functionAppConfig
    else:
        assert properties["functionAppConfig"] is None
        assert properties["siteConfig"]["linuxFxVersion"] == f"Python|{version}"
        assert app_settings(plan)["FUNCTIONS_WORKER_RUNTIME"] == "python"
    assert MAIN.evaluate(MAIN.outputs["pythonVersion"].value, {"hostingPlan": plan, "pythonVersion": given}) == version


def test_deploy_script_passes_its_python_to_the_template_and_builds_the_package_for_it() -> None:
    script = (INFRA / "deploy.sh").read_text()
    assert 'pythonVersion="${python_version}"' in script
    assert '--python-version "${python_version}"' in script
    # requirements.txt installs on both: azure-functions 1.x declares Python < 3.13.
    requirements = (REPO_ROOT / "requirements.txt").read_text()
    assert 'azure-functions==1.26.0; python_version < "3.13"' in requirements
    assert 'azure-functions-runtime==1.3.0; python_version >= "3.13"' in requirements


# azd's placeholder: ${NAME} or ${NAME=default} (drone/envsubst, which azd uses).
PLACEHOLDER = re.compile(r"\$\{(\w+)(?:=([^}]*))?\}")


def test_parameters_file_only_sets_declared_and_allowed_parameters() -> None:
    document = json.loads((INFRA / "main.parameters.json").read_text())
    for name, entry in document["parameters"].items():
        assert name in MAIN.params, f"main.parameters.json sets {name}, which main.bicep does not declare"
        value = entry["value"]
        placeholder = PLACEHOLDER.fullmatch(value) if isinstance(value, str) else None
        if placeholder:
            # azd fills it; a default given must be a value the parameter takes.
            value = placeholder.group(2)
            if value is None:
                continue
        allowed = MAIN.params[name].decorators.get("allowed")
        if allowed:
            assert value in MAIN.evaluate(allowed[0]), f"{name}={entry['value']}"
    # The code's defaults are only set in one place: main.bicep's parameter defaults.
    for name in ("windowSize", "batchSize", "maxPixels", "gdalCacheMaxMb"):
        assert name not in document["parameters"]


def test_deploy_script_reads_only_outputs_the_template_has() -> None:
    script = (INFRA / "deploy.sh").read_text()
    used = set(re.findall(r"\$\(output (\w+)\)", script))
    assert used, "deploy.sh reads no outputs?"
    assert used - set(MAIN.outputs) == set()
    # And passes only parameters the template declares (the `deploy` function's --parameters).
    deploy_function = script[script.index("\ndeploy() {") : script.index("\n}\n", script.index("\ndeploy() {"))]
    passed = set(re.findall(r"(\w+)=\"", deploy_function)) - {"with_subscription"}  # its local variable
    assert passed == {
        "hostingPlan",
        "pythonVersion",
        "baseName",
        "location",
        "environmentName",
        "vnetEnabled",
        "durableBackend",
        "deployerPrincipalId",
        "deployerPrincipalType",
        "grantDeployerDataAccess",
        "deployEventSubscription",
        "catalogEnabled",
        "catalogAdministratorName",
    }
    assert passed - set(MAIN.params) == set()
    assert "main.parameters.json" in script and (INFRA / "main.parameters.json").is_file()


def test_deploy_script_gives_every_azd_placeholder_a_value() -> None:
    """main.parameters.json is azd's and deploy.sh's: the Azure CLI passes a ${...} on literally, so
    deploy.sh must set each such parameter itself, after the file (the later value wins)."""
    document = json.loads((INFRA / "main.parameters.json").read_text())
    placeholders = {
        name
        for name, entry in document["parameters"].items()
        if isinstance(entry["value"], str) and PLACEHOLDER.search(entry["value"])
    }
    assert {"environmentName", "location"} <= placeholders  # azd's own conventions
    script = (INFRA / "deploy.sh").read_text()
    deploy_function = script[script.index("\ndeploy() {") : script.index("\n}\n", script.index("\ndeploy() {"))]
    after_file = deploy_function[deploy_function.index('"@${PARAMETERS}"') :]
    assert placeholders - set(re.findall(r"(\w+)=\"", after_file)) == set()


@pytest.mark.parametrize("plan", PLANS)
def test_telemetry_goes_to_application_insights_with_the_identity_and_once(plan: str) -> None:
    from tilecommit.observability import monitoring

    deployed = app_settings(plan)
    environ = with_stand_ins(deployed)
    authentication = environ[monitoring.AUTHENTICATION_STRING]
    environ[monitoring.AUTHENTICATION_STRING] = authentication.replace(
        "{identity.properties.clientId}", STAND_INS["identity.properties.clientId"]
    )
    plan_ = monitoring.plan_telemetry(environ)
    assert plan_.kind == "azure-monitor"
    assert plan_.managed_identity_client_id == STAND_INS["identity.properties.clientId"]
    # The worker streams its own telemetry (the host stops forwarding its logs) and does not
    # configure the distro a second time: function_app.py does, with the credential.
    assert deployed["PYTHON_ENABLE_OPENTELEMETRY"] == "true"
    assert "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY" not in deployed
    host = json.loads((INFRA.parent / "host.json").read_text())
    assert host["telemetryMode"] == "OpenTelemetry"


def test_the_workbook_shows_every_query_in_the_repository_once() -> None:
    source = (INFRA / "modules" / "monitoring.bicep").read_text()
    loaded = re.findall(r"loadTextContent\('\.\./workbook/([^']+\.kql)'\)", source)
    on_disk = sorted(p.name for p in (INFRA / "workbook").glob("*.kql"))
    assert sorted(loaded) == on_disk and len(set(loaded)) == len(loaded)
    workbooks = Bicep(INFRA / "modules" / "monitoring.bicep").resources_of_type("Microsoft.Insights/workbooks")
    assert len(workbooks) == 1


# ------------------------------------------------------------------------------------------------
# The Durable backend: host.json is the Azure Storage provider's; app settings switch it.
# ------------------------------------------------------------------------------------------------

HOST_OVERRIDE = "AzureFunctionsJobHost__"
BACKENDS = MAIN.evaluate(MAIN.params["durableBackend"].decorators["allowed"][0])
SCHEDULER = Bicep(INFRA / "modules" / "durable-task-scheduler.bicep")


def effective_host_json(deployed: dict[str, Any]) -> dict[str, Any]:
    """host.json as the Functions host reads it on Azure: each `AzureFunctionsJobHost__a__b`
    app setting replaces the value at a.b (the host's configuration, app settings over host.json)."""
    host = json.loads((REPO_ROOT / "host.json").read_text())
    for name, value in deployed.items():
        if name.startswith(HOST_OVERRIDE):
            *path, leaf = name[len(HOST_OVERRIDE) :].split("__")
            node = host
            for key in path:
                node = node.setdefault(key, {})
            node[leaf] = value
    return host


def test_the_storage_provider_is_the_default_backend_and_the_scheduler_the_other() -> None:
    assert BACKENDS == ["AzureStorage", "DurableTaskScheduler"]
    assert MAIN.evaluate(MAIN.params["durableBackend"].value) == "AzureStorage"


@pytest.mark.parametrize("plan", PLANS)
def test_the_default_backend_deploys_host_json_as_it_is(plan: str) -> None:
    deployed = app_settings(plan)
    assert [n for n in deployed if n.startswith(HOST_OVERRIDE) or "SCHEDULER" in n] == []
    durable = effective_host_json(deployed)["extensions"]["durableTask"]
    assert "type" not in durable["storageProvider"]  # the Azure Storage provider
    assert durable["hubName"] == settings.TASK_HUB


@pytest.mark.parametrize("plan", PLANS)
def test_the_scheduler_backend_switches_the_provider_and_signs_in_as_the_host(plan: str) -> None:
    deployed = app_settings(plan, durableBackend="DurableTaskScheduler")
    host = effective_host_json(deployed)
    provider = host["extensions"]["durableTask"]["storageProvider"]
    assert provider["type"] == "azureManaged"
    # The provider's connection: the scheduler's endpoint, Entra ID as the host's identity.
    connection = deployed[provider["connectionStringName"]]
    expected = "Endpoint={durableTaskScheduler.outputs.endpoint};Authentication=ManagedIdentity;ClientID={identity.properties.clientId}"
    assert str(connection) == expected
    # The task hub the host uses is the one the module creates and grants the host a role on.
    inputs = MAIN.property(MAIN.evaluate(MAIN.modules["durableTaskScheduler"].value, {}), "params")
    assert inputs["taskHubName"] == host["extensions"]["durableTask"]["hubName"] == settings.TASK_HUB
    assert isinstance(inputs["hostPrincipalId"], Unresolved)
    assert inputs["hostPrincipalId"].text == "identity.properties.principalId"
    # The bundle has the provider (4.32.0 and later), and the module uses the GA resource API.
    assert host["extensionBundle"]["version"].startswith("[4.32.0,")
    for resource in SCHEDULER.resources.values():
        if resource.type_or_path.startswith("Microsoft.DurableTask/"):
            assert resource.type_or_path.endswith("@2025-11-01")
    # Nothing else of the app changes with the backend.
    assert {
        n: v for n, v in deployed.items() if not n.startswith(HOST_OVERRIDE) and n != provider["connectionStringName"]
    } == app_settings(plan)


def test_the_scheduler_module_is_deployed_only_for_its_backend() -> None:
    module = MAIN.modules["durableTaskScheduler"]
    assert MAIN.evaluate(module.condition, {"durableBackend": "DurableTaskScheduler"}) is True
    assert MAIN.evaluate(module.condition, {"durableBackend": "AzureStorage"}) is False
