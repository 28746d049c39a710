"""Two trust zones, read from the templates: every role assignment is one row of the matrix in
docs/security.md (identity, role, scope) and every row is an assignment; the data identity (the
code's, which parses untrusted uploads) holds nothing on the account and nothing on a container
but its own; the app's settings give the code that identity and the host the other.

Azurite checks no roles, so no local run can show a refusal: what is checked is that the
templates grant exactly what the docs say, and that the code signs in as the identity the docs
say (tests/test_storage_settings.py: the code's clients come from its own connection)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.bicep import INFRA, Bicep, Unresolved
from tests.test_infra_roles import role_name
from tilecommit import settings
from tilecommit.storage import StorageConnection

from .markdown_tables import table_rows
from .test_infra_agreement import PLANS, STAND_INS, app_settings, with_stand_ins

MAIN = Bicep(INFRA / "main.bicep")
SECURITY = Path(__file__).resolve().parents[1] / "docs" / "security.md"
#: Who a principal id expression in main.bicep is.
PRINCIPALS = {
    "identity.properties.principalId": "host",
    "dataIdentity.properties.principalId": "data",
    "events.outputs.principalId": "Event Grid system topic",
    "<deployer>": "deployer",
}
#: How the matrix names a scope, by the scope resource's type.
SCOPES = {
    "Microsoft.Storage/storageAccounts": lambda name: "account",
    "Microsoft.Storage/storageAccounts/blobServices/containers": lambda name: f"container {name}",
    "Microsoft.Storage/storageAccounts/tableServices/tables": lambda name: f"table {name}",
    "Microsoft.Insights/components": lambda name: "Application Insights",
    "Microsoft.EventGrid/topics": lambda name: "completion topic",
    "Microsoft.DurableTask/schedulers/taskHubs": lambda name: f"task hub {name}",
}
#: Every plan, with a deployer and its data access and the scheduler backend, so that every
#: conditional grant is made.
DEPLOYER = {
    "deployerPrincipalId": "<deployer>",
    "grantDeployerDataAccess": True,
    "durableBackend": "DurableTaskScheduler",
}


def matrix() -> set[tuple[str, str, str]]:
    """The (identity, role, scope) rows of docs/security.md's matrix."""
    return {tuple(cells[:3]) for cells in table_rows(SECURITY, ["identity", "role", "scope"])}


def granted(replaced: dict[str, Path] | None = None) -> set[tuple[str, str, str]]:
    """Every role assignment of every module main.bicep deploys, on every plan, as (identity,
    role, scope). ``replaced``: a module's file read from another path (the mutation check)."""
    found = set()
    for plan in PLANS:
        params = {"hostingPlan": plan, **DEPLOYER}
        for name, module in MAIN.modules.items():
            path = (replaced or {}).get(name, INFRA / module.type_or_path)
            bicep = Bicep(path)
            inputs = MAIN.property(MAIN.evaluate(module.value, params), "params")
            for assignment in bicep.resources_of_type("Microsoft.Authorization/roleAssignments"):
                if assignment.condition is not None and bicep.evaluate(assignment.condition, inputs) is False:
                    continue
                found.add(describe(bicep, assignment, inputs))
    return found


def describe(bicep: Bicep, assignment, inputs: dict) -> tuple[str, str, str]:
    text = bicep.text(assignment.value)
    role = role_name(re.search(r"roleDefinitions'\s*,\s*(\w+)RoleId\s*\)", text).group(1))
    principal_param = re.search(r"principalId:\s*(\w+)", text).group(1)
    principal = inputs[principal_param]
    principal = principal.text if isinstance(principal, Unresolved) else principal
    assert principal in PRINCIPALS, f"{bicep.path.name}: a role for {principal!r}, whom the matrix does not know"
    scope = bicep.resources[re.search(r"^\s*scope:\s*(\w+)", text, re.M).group(1)]
    scope_type = scope.type_or_path.split("@")[0]
    assert scope_type in SCOPES, f"{bicep.path.name}: a role on a {scope_type}, which the matrix does not know"
    scope_name = bicep.evaluate(scope.value, inputs).get("name")
    return PRINCIPALS[principal], role, SCOPES[scope_type](scope_name)


def test_every_role_assignment_is_a_row_of_the_matrix_and_every_row_an_assignment() -> None:
    made, documented = granted(), matrix()
    assert made - documented == set(), "granted by the templates, not in docs/security.md"
    assert documented - made == set(), "in docs/security.md, not granted by the templates"


def test_the_data_identity_holds_nothing_on_the_account_and_only_its_own_containers() -> None:
    data = {(role, scope) for who, role, scope in granted() if who == "data"}
    own = {
        f"container {settings.INPUT_CONTAINER}",
        f"container {settings.TILES_CONTAINER}",
        f"container {settings.OUTPUT_CONTAINER}",
        f"table {settings.MANIFEST_TABLE}",
        "completion topic",
    }
    assert {scope for _, scope in data} == own
    assert ("Storage Blob Data Reader", f"container {settings.INPUT_CONTAINER}") in data  # read only, the uploads
    host_side = ("account", "container azure-webjobs-secrets", "container azure-webjobs-hosts")
    assert not [scope for _, scope in data if scope in host_side]


def test_a_wider_scope_in_a_template_fails_the_check(tmp_path) -> None:
    """The check above is not vacuous: the tiles grant moved to the account is caught."""
    roles = INFRA / "modules" / "storage-roles.bicep"
    mutated = tmp_path / "storage-roles.bicep"
    shutil.copy(roles, mutated)
    text = mutated.read_text()
    assert "  scope: tilesContainer\n" in text
    mutated.write_text(text.replace("  scope: tilesContainer\n", "  scope: storageAccount\n", 1))
    made = granted({"storageRoles": mutated})
    assert ("data", "Storage Blob Data Contributor", "account") in made
    assert made != matrix()


@pytest.mark.parametrize("plan", PLANS)
def test_the_host_and_the_code_sign_in_as_their_own_identities(plan: str) -> None:
    deployed = app_settings(plan)
    host, data = settings.STORAGE_CONNECTION, settings.DATA_CONNECTION
    assert deployed[f"{host}__clientId"] == Unresolved("identity.properties.clientId")
    assert deployed[f"{data}__clientId"] == Unresolved("dataIdentity.properties.clientId")
    assert deployed[f"{data}__credential"] == "managedidentity"
    # What azure-identity picks when the code asks for a credential without naming one.
    assert deployed["AZURE_CLIENT_ID"] == Unresolved("dataIdentity.properties.clientId")
    assigned = MAIN.property(MAIN.evaluate(MAIN.resources["functionApp"].value, {"hostingPlan": plan}), "identity")
    assert "identity.id" in str(assigned["userAssignedIdentities"])
    assert "dataIdentity.id" in str(assigned["userAssignedIdentities"])
    # The code reads its connection from those settings.
    environ = with_stand_ins(deployed)
    code = StorageConnection.for_data(environ)
    assert code.client_id == STAND_INS["dataIdentity.properties.clientId"]
    assert code.blob_endpoint == "https://stexample.blob.core.windows.net"
    assert StorageConnection.from_env(environ=environ).client_id == STAND_INS["identity.properties.clientId"]
