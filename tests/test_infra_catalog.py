"""The catalog in Azure (main.bicep catalogEnabled), read from the templates and the deploy step:

- off by default: no server, no API, no catalog setting (the embedded default needs no database);
- on: every catalog setting the code reads, from the server's and the API's outputs, signing in
  as the data identity with Entra tokens;
- the server: Microsoft Entra authentication only, the deployer its administrator, Burstable B1ms,
  the extensions pgstac's migration creates allowed (read from pypgstac's own migration);
- the network: a private endpoint and no firewall rule with vnetEnabled, the API in the network;
- the API: the pinned stac-fastapi-pgstac image, an identity of its own, read only;
- the deploy step (azd's postprovision hook and deploy.sh): pgstac's migration as the deployer,
  then the data identity granted pgstac_ingest and the API's pgstac_read, nothing more.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pypgstac
import pytest
import yaml

from tests.bicep import INFRA, REPO_ROOT, Bicep, Unresolved
from tilecommit import settings

MAIN = Bicep(INFRA / "main.bicep")
POSTGRES = Bicep(INFRA / "modules" / "postgres.bicep")
STAC_API = Bicep(INFRA / "modules" / "stac-api.bicep")
MIGRATE = INFRA / "catalog-migrate.sh"
HOOK = INFRA / "hooks" / "postprovision.sh"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"
CATALOG_MODULES = ("postgres", "stacApi")


def app_settings(**params: Any) -> dict[str, Any]:
    body = MAIN.evaluate(MAIN.resources["functionApp"].value, {"hostingPlan": "FlexConsumption", **params})
    entries = MAIN.property(body, "properties", "siteConfig", "appSettings")
    return {entry["name"]: entry["value"] for entry in entries}


def module_params(name: str, **params: Any) -> dict[str, Any]:
    return MAIN.property(MAIN.evaluate(MAIN.modules[name].value, params), "params")


def test_the_catalog_is_off_by_default_and_then_sets_nothing() -> None:
    assert MAIN.evaluate(MAIN.params["catalogEnabled"].value) is False
    for name in CATALOG_MODULES:
        assert MAIN.evaluate(MAIN.modules[name].condition) is False
        assert MAIN.evaluate(MAIN.modules[name].condition, {"catalogEnabled": True}) is True
    deployed = app_settings()
    assert [n for n in settings.CATALOG_SETTINGS if n in deployed] == []
    assert MAIN.evaluate(MAIN.outputs["catalogHost"].value) == ""
    assert MAIN.evaluate(MAIN.outputs["stacApiUrl"].value) == ""


def test_with_the_catalog_the_app_publishes_as_its_data_identity_with_entra_tokens() -> None:
    deployed = app_settings(catalogEnabled=True)
    catalog = {n: deployed[n] for n in settings.CATALOG_SETTINGS}
    assert catalog[settings.SETTING_PGSTAC_HOST] == Unresolved("postgres.outputs.fqdn")
    assert catalog[settings.SETTING_PGSTAC_PORT] == str(settings.DEFAULT_PGSTAC_PORT)
    assert catalog[settings.SETTING_PGSTAC_DATABASE] == settings.DEFAULT_PGSTAC_DATABASE
    # The role catalog-migrate.sh makes for the data identity is named after it; the token is that
    # identity's (AZURE_CLIENT_ID), the least privileged of the app's two.
    assert catalog[settings.SETTING_PGSTAC_USER] == Unresolved("dataIdentity.name")
    assert catalog[settings.SETTING_PGSTAC_AUTH] == settings.PGSTAC_AUTH_ENTRA
    assert deployed["AZURE_CLIENT_ID"] == Unresolved("dataIdentity.properties.clientId")
    assert catalog[settings.SETTING_STAC_API_URL] == Unresolved("stacApi.outputs.url")
    assert STAC_API.evaluate(STAC_API.outputs["url"].value).startswith("https://")
    # Nothing else of the app changes with the catalog.
    assert {n: v for n, v in deployed.items() if n not in settings.CATALOG_SETTINGS} == app_settings()
    # The deploy step maps exactly the identity the app signs in as.
    assert MAIN.evaluate(MAIN.outputs["catalogIngestRole"].value, {"catalogEnabled": True}) == Unresolved(
        "dataIdentity.name"
    )
    assert module_params("postgres", catalogEnabled=True)["databaseName"] == settings.DEFAULT_PGSTAC_DATABASE


def server(**params: Any) -> dict[str, Any]:
    return POSTGRES.evaluate(POSTGRES.resources["server"].value, params)


def test_the_server_takes_entra_tokens_only_and_the_deployer_administers_it() -> None:
    body = server()
    assert body["properties"]["authConfig"] == {
        "activeDirectoryAuth": "Enabled",
        "passwordAuth": "Disabled",
        "tenantId": Unresolved("tenant().tenantId"),
    }
    text = (INFRA / "modules" / "postgres.bicep").read_text()
    assert "administratorLogin" not in text and "Password:" not in text  # no password anywhere
    assert body["sku"] == {"name": "Standard_B1ms", "tier": "Burstable"}
    admin = POSTGRES.evaluate(POSTGRES.resources["administrator"].value)
    assert admin["name"] == Unresolved("administratorObjectId")
    assert admin["properties"]["principalName"] == Unresolved("administratorName")
    given = {"deployerPrincipalId": "0000-oid", "catalogAdministratorName": "ops@example.org"}
    params = module_params("postgres", catalogEnabled=True, deployerPrincipalType="Group", **given)
    assert (params["administratorObjectId"], params["administratorName"]) == tuple(given.values())
    assert params["administratorType"] == "Group"


def test_the_server_allows_exactly_the_extensions_pgstacs_migration_creates() -> None:
    migrations = Path(pypgstac.__file__).parent / "migrations"
    sql = (migrations / f"pgstac.{pypgstac.__version__}.sql").read_text()
    created = {name.lower() for name in re.findall(r"CREATE EXTENSION IF NOT EXISTS (\w+)", sql)}
    assert created == {"postgis", "btree_gist", "unaccent"}
    allowed = POSTGRES.evaluate(POSTGRES.vars["allowedExtensions"].value)
    assert {name.lower() for name in allowed.split(",")} == created
    configuration = POSTGRES.evaluate(POSTGRES.resources["extensions"].value)
    assert configuration["name"] == "azure.extensions"
    assert configuration["properties"]["value"] == allowed
    # The version the deploy step installs is the one read here.
    assert f"pypgstac=={pypgstac.__version__}" in (REPO_ROOT / "requirements-dev.txt").read_text().splitlines()


@pytest.mark.parametrize(("vnet", "private"), [(False, False), (True, True)])
def test_the_server_is_private_in_the_isolated_network_and_the_api_reaches_it_there(vnet: bool, private: bool) -> None:
    params = module_params("postgres", catalogEnabled=True, vnetEnabled=vnet)
    assert params["privateAccess"] is private
    assert MAIN.evaluate(MAIN.vars["networkIsolated"].value, {"vnetEnabled": vnet}) is private
    for name in ("dnsZone", "dnsZoneLink", "privateEndpoint", "dnsZoneGroup"):
        assert POSTGRES.evaluate(POSTGRES.resources[name].condition, {"privateAccess": private}) is private, name
    # No firewall rule when private: the public endpoint admits nobody (but the deployer's address,
    # for the minutes of the migration); else Azure's "Azure services" rule.
    assert POSTGRES.evaluate(POSTGRES.resources["azureServices"].condition, {"privateAccess": private}) is not private
    rule = POSTGRES.evaluate(POSTGRES.resources["azureServices"].value)
    assert rule["properties"] == {"startIpAddress": "0.0.0.0", "endIpAddress": "0.0.0.0"}
    endpoint = POSTGRES.evaluate(POSTGRES.resources["privateEndpoint"].value)
    (connection,) = endpoint["properties"]["privateLinkServiceConnections"]
    assert connection["properties"]["groupIds"] == ["postgresqlServer"]
    assert connection["properties"]["privateLinkServiceId"] == Unresolved("server.id")
    zone = POSTGRES.evaluate(POSTGRES.resources["dnsZone"].value)
    assert zone["name"] == "privatelink.postgres.database.azure.com"
    api = module_params("stacApi", catalogEnabled=True, vnetEnabled=vnet)
    subnet = MAIN.evaluate(MAIN.modules["stacApi"].value, {"catalogEnabled": True, "vnetEnabled": vnet})
    expected = Unresolved("virtualNetwork.outputs.stacApiSubnetId") if private else ""
    assert api["infrastructureSubnetId"] == expected, subnet
    if private:
        assert params["privateEndpointSubnetId"] == Unresolved("virtualNetwork.outputs.privateEndpointSubnetId")


def test_the_stac_api_is_the_pinned_image_with_an_identity_of_its_own_and_reads_only() -> None:
    image = STAC_API.evaluate(STAC_API.params["image"].value)
    assert re.fullmatch(r"ghcr\.io/stac-utils/stac-fastapi-pgstac:\d+\.\d+\.\d+", image), image
    app = STAC_API.evaluate(STAC_API.resources["app"].value)
    assert list(app["identity"]["userAssignedIdentities"]) == ["{identity.id}"]
    (container,) = app["properties"]["template"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["PGUSER"] == Unresolved("identity.name")
    assert env["AZURE_CLIENT_ID"] == Unresolved("identity.properties.clientId")
    assert "PGPASSWORD" not in env and "POSTGRES_PASS" not in env
    assert app["properties"]["configuration"]["ingress"]["allowInsecure"] is False
    assert app["properties"]["template"]["scale"]["minReplicas"] == 0
    launcher = (INFRA / "stac-api" / "launch.py").read_text()
    assert "loadTextContent('../stac-api/launch.py')" in STAC_API.text(STAC_API.resources["app"].node)
    compile(launcher, "launch.py", "exec")
    # The Transactions extension stays off: no write pool, and the read role is the one granted.
    assert "add_write_connection_pool" not in launcher and "writepool" not in launcher
    assert "password=entra_token," in launcher and 'ssl="require"' in launcher
    read_role = MAIN.evaluate(MAIN.outputs["catalogReadRole"].value, {"catalogEnabled": True})
    assert read_role == Unresolved("stacApi.outputs.identityName")


# ------------------------------------------------------------------------------------------------
# The deploy step
# ------------------------------------------------------------------------------------------------

OUTPUTS = {
    "catalogEnabled": "true",
    "catalogServerName": "tilecommit-pg-abc",
    "catalogHost": "tilecommit-pg-abc.postgres.database.azure.com",
    "catalogDatabase": settings.DEFAULT_PGSTAC_DATABASE,
    "catalogIngestRole": "tilecommit-data-id-abc",
    "catalogReadRole": "tilecommit-stac-abc-id",
}


def run(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    # No az on PATH: a dry run must not need it, let alone call it.
    environment = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "PYTHON": sys.executable, **env}
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=60, env=environment)


def test_azd_runs_the_migration_after_provisioning() -> None:
    document = yaml.safe_load((REPO_ROOT / "azure.yaml").read_text())
    hook = document["hooks"]["postprovision"]
    assert hook["shell"] == "sh" and (REPO_ROOT / hook["run"]) == HOOK
    for script in (HOOK, MIGRATE):
        assert os.access(script, os.X_OK) and script.read_text().startswith("#!/usr/bin/env bash\n")
    # The parameters azd fills: off unless CATALOG_ENABLED, the administrator's name from azd's env.
    parameters = (INFRA / "main.parameters.json").read_text()
    assert '"${CATALOG_ENABLED=false}"' in parameters and '"${AZURE_PRINCIPAL_NAME=}"' in parameters


@pytest.mark.parametrize("script", [MIGRATE, HOOK], ids=lambda p: p.name)
def test_shellcheck_is_clean(script: Path) -> None:
    if not SHELLCHECK.is_file():
        pytest.fail(f"shellcheck is not installed at {SHELLCHECK}: run `make setup` (requirements-dev.txt)")
    result = subprocess.run(
        [str(SHELLCHECK), "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_hook_migrates_pgstac_then_grants_one_role_each_and_closes_the_firewall() -> None:
    result = run(
        HOOK, TILECOMMIT_DRY_RUN="1", AZURE_RESOURCE_GROUP="rg-azd", TILECOMMIT_CLIENT_IP="203.0.113.9", **OUTPUTS
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("az ")]
    opened, closed = commands
    assert opened[:4] == ["postgres", "flexible-server", "firewall-rule", "create"]
    assert opened[opened.index("--start-ip-address") + 1] == opened[opened.index("--end-ip-address") + 1]
    assert opened[opened.index("--start-ip-address") + 1] == "203.0.113.9"
    assert closed[:4] == ["postgres", "flexible-server", "firewall-rule", "delete"]
    assert closed[closed.index("--rule-name") + 1] == opened[opened.index("--rule-name") + 1]
    assert opened[opened.index("--name") + 1] == OUTPUTS["catalogServerName"]
    assert lines.index("pypgstac migrate") < lines.index(closed_line(lines))
    assert f"pip install pypgstac=={pypgstac.__version__}" in lines
    grants = [line for line in lines if "GRANT" in line]
    assert grants == [
        f'pgstac: GRANT pgstac_ingest TO "{OUTPUTS["catalogIngestRole"]}"',
        f'pgstac: GRANT pgstac_read TO "{OUTPUTS["catalogReadRole"]}"',
    ]
    principals = [line for line in lines if "pgaadauth_create_principal" in line]
    # Azure's function: (role name, is_admin, is_mfa); neither identity is an administrator.
    assert len(principals) == 2 and all("pgaadauth_create_principal(%s, false, false)" in p for p in principals)
    assert lines.index("pypgstac migrate") < lines.index(principals[0])


def closed_line(lines: list[str]) -> str:
    return next(line for line in lines if "firewall-rule delete" in line)


def test_without_the_catalog_the_step_does_nothing_and_without_a_group_it_says_so() -> None:
    result = run(HOOK, TILECOMMIT_DRY_RUN="1", AZURE_RESOURCE_GROUP="rg", **{**OUTPUTS, "catalogEnabled": "false"})
    assert result.returncode == 0 and "No catalog" in result.stdout and "az " not in result.stdout
    result = run(HOOK, TILECOMMIT_DRY_RUN="1", **OUTPUTS)
    assert result.returncode == 1 and "AZURE_RESOURCE_GROUP is not set" in result.stderr


def test_deploy_sh_runs_the_same_step_after_the_infrastructure() -> None:
    script = (INFRA / "deploy.sh").read_text()
    step = script.index('"${SCRIPT_DIR}/catalog-migrate.sh" --resource-group "${resource_group}" --from-deployment')
    assert script.index("  deploy false\n") < step < script.index("# 2. Code")
    # The outputs the step reads exist in the template.
    used = set(re.findall(r"\b(catalog\w+)\b", MIGRATE.read_text())) - {"catalog_roles"}
    assert used <= set(MAIN.outputs), used - set(MAIN.outputs)
