"""vnetEnabled, read from the templates: the network, the storage account's private endpoints and
DNS zones exist only with it (and only on Flex Consumption), they target the account's blob, queue
and table, the zones are linked to the network, the app integrates with the delegated subnet, and
the account's public endpoint then refuses all but trusted Azure services."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bicep import INFRA, Bicep, Unresolved

MAIN = Bicep(INFRA / "main.bicep")
STORAGE = Bicep(INFRA / "modules" / "storage.bicep")
VNET = Bicep(INFRA / "modules" / "vnet.bicep")
ENDPOINTS = Bicep(INFRA / "modules" / "storage-private-endpoints.bicep")
NETWORK_MODULES = ("virtualNetwork", "storagePrivateEndpoints")


def site(params: dict[str, Any]) -> dict[str, Any]:
    return MAIN.evaluate(MAIN.resources["functionApp"].value, params)["properties"]


@pytest.mark.parametrize(
    ("params", "isolated"),
    [
        ({}, False),  # the default: today's template
        ({"vnetEnabled": True}, True),
        ({"vnetEnabled": True, "hostingPlan": "Consumption"}, False),  # no VNet integration on Y1
        ({"vnetEnabled": False, "hostingPlan": "Consumption"}, False),
    ],
)
def test_the_network_exists_only_with_vnet_enabled_on_flex(params: dict[str, Any], isolated: bool) -> None:
    assert MAIN.evaluate(MAIN.params["vnetEnabled"].value) is False
    for name in NETWORK_MODULES:
        assert MAIN.evaluate(MAIN.modules[name].condition, params) is isolated, name
    subnet = site(params)["virtualNetworkSubnetId"]
    if isolated:
        assert isinstance(subnet, Unresolved) and subnet.text == "virtualNetwork.outputs.appSubnetId"
    else:
        assert subnet is None
    storage = MAIN.property(MAIN.evaluate(MAIN.modules["storage"].value, params), "params")
    acls = STORAGE.evaluate(STORAGE.resources["storageAccount"].value, storage)["properties"]
    assert acls["networkAcls"] == {"bypass": "AzureServices", "defaultAction": "Deny" if isolated else "Allow"}
    # On in both: Event Grid's dead letters come in through it (infra/checkov-skips.toml, CKV_AZURE_59).
    assert acls["publicNetworkAccess"] == "Enabled"
    assert MAIN.evaluate(MAIN.outputs["networkIsolated"].value, params) is isolated


def test_the_app_subnet_is_delegated_to_flex_consumption_and_the_endpoints_have_their_own() -> None:
    (network,) = VNET.resources_of_type("Microsoft.Network/virtualNetworks")
    subnets = {s["name"]: s["properties"] for s in VNET.evaluate(network.value)["properties"]["subnets"]}
    assert set(subnets) == {"app", "private-endpoints", "stac-api"}
    # The app's and the STAC API's environments each have a delegated subnet of their own.
    for name in ("app", "stac-api"):
        assert [d["properties"]["serviceName"] for d in subnets[name]["delegations"]] == ["Microsoft.App/environments"]
    assert "delegations" not in subnets["private-endpoints"]
    assert VNET.evaluate(VNET.outputs["appSubnetId"].value) == "{virtualNetwork.id}/subnets/app"
    assert (
        VNET.evaluate(VNET.outputs["privateEndpointSubnetId"].value) == "{virtualNetwork.id}/subnets/private-endpoints"
    )
    params = MAIN.property(
        MAIN.evaluate(MAIN.modules["storagePrivateEndpoints"].value, {"vnetEnabled": True}), "params"
    )
    assert params["subnetId"].text == "virtualNetwork.outputs.privateEndpointSubnetId"
    assert params["virtualNetworkId"].text == "virtualNetwork.outputs.id"
    assert params["storageAccountName"].text == "storage.outputs.name"


def test_private_endpoints_target_the_accounts_blob_queue_and_table_with_linked_dns_zones() -> None:
    services = ENDPOINTS.evaluate(ENDPOINTS.params["services"].value)
    # The app uses no Azure Files (Flex keeps its code in a blob container), so no file endpoint.
    assert services == ["blob", "queue", "table"]
    for name in ("dnsZones", "dnsZoneLinks", "privateEndpoints", "dnsZoneGroups"):
        assert ENDPOINTS.text(ENDPOINTS.resources[name].loop_over) == "services", name
    (account,) = ENDPOINTS.resources_of_type("Microsoft.Storage/storageAccounts")
    assert account.existing and ENDPOINTS.text(account.value).count("name: storageAccountName") == 1
    for service in services:
        zone = ENDPOINTS.evaluate(ENDPOINTS.resources["dnsZones"].value, {"service": service})
        assert zone["name"] == f"privatelink.{service}.{{environment().suffixes.storage}}"
        link = ENDPOINTS.evaluate(ENDPOINTS.resources["dnsZoneLinks"].value, {"service": service})
        assert link["properties"] == {
            "registrationEnabled": False,
            "virtualNetwork": {"id": Unresolved("virtualNetworkId")},
        }
        endpoint = ENDPOINTS.evaluate(ENDPOINTS.resources["privateEndpoints"].value, {"service": service})
        (connection,) = endpoint["properties"]["privateLinkServiceConnections"]
        assert connection["properties"]["groupIds"] == [service]
        assert connection["properties"]["privateLinkServiceId"] == Unresolved("storageAccount.id")
        assert endpoint["properties"]["subnet"] == {"id": Unresolved("subnetId")}
    # Each link, endpoint and record belongs to its own service's zone (index i of the same loop).
    assert "parent: dnsZones[i]" in ENDPOINTS.text(ENDPOINTS.resources["dnsZoneLinks"].node)
    groups = ENDPOINTS.text(ENDPOINTS.resources["dnsZoneGroups"].node)
    assert "parent: privateEndpoints[i]" in groups and "privateDnsZoneId: dnsZones[i].id" in groups


def test_the_host_starts_after_its_private_endpoints() -> None:
    text = MAIN.text(MAIN.resources["functionApp"].node)
    depends = text[text.index("dependsOn: [") :]
    assert "storagePrivateEndpoints" in depends and "storageRoles" in depends
