"""Every role definition id in the Bicep templates is pinned to its role's name.

A role is assigned by a GUID that says nothing about what it grants: a wrong one deploys, and
grants something else (or nothing). Each template names its ids in variables called after the
role (``storageBlobDataOwnerRoleId``); infra/built-in-roles.toml lists each role's published id.
"""

from __future__ import annotations

import re
import tomllib

from tests.bicep import INFRA

ROLES = tomllib.loads((INFRA / "built-in-roles.toml").read_text())["roles"]
GUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
ROLE_VARIABLE = re.compile(rf"^var\s+(\w+)RoleId\s*=\s*'({GUID})'", re.M)
ROLE_DEFINITION = re.compile(r"roleDefinitions'\s*,\s*([^)]+)\)")


def role_name(variable: str) -> str:
    """``storageBlobDataOwner`` -> ``Storage Blob Data Owner``; ``eventGrid...`` -> ``EventGrid ...``
    (the role names spell the service as one word)."""
    name = " ".join(word.capitalize() for word in re.findall(r"[a-z]+|[A-Z][a-z]*", variable))
    return name.replace("Event Grid ", "EventGrid ")


def bicep_files():
    return sorted(INFRA.rglob("*.bicep"))


def test_every_role_id_variable_holds_the_id_of_the_role_it_is_named_after():
    found = {}
    for path in bicep_files():
        for variable, guid in ROLE_VARIABLE.findall(path.read_text()):
            name = role_name(variable)
            assert name in ROLES, f"{path.name}: {variable}RoleId names {name!r}, not in infra/built-in-roles.toml"
            assert guid.lower() == ROLES[name], f"{path.name}: {variable}RoleId is {guid}, {name} is {ROLES[name]}"
            found[name] = guid
    assert set(found) == set(ROLES), f"listed but never assigned: {sorted(set(ROLES) - set(found))}"


def test_role_assignments_use_the_named_variables_and_no_bare_id():
    for path in bicep_files():
        text = path.read_text()
        for argument in ROLE_DEFINITION.findall(text):
            assert re.fullmatch(r"\s*\w+RoleId\s*", argument), f"{path.name}: roleDefinitions with {argument!r}"
        declared = {guid.lower() for _, guid in ROLE_VARIABLE.findall(text)}
        assert {g.lower() for g in re.findall(GUID, text)} <= declared, f"{path.name}: a GUID outside a role variable"


def test_the_name_mapping_reads_camel_case():
    assert role_name("storageBlobDataOwner") == "Storage Blob Data Owner"
    assert role_name("monitoringMetricsPublisher") == "Monitoring Metrics Publisher"
    assert role_name("eventGridDataSender") == "EventGrid Data Sender"
