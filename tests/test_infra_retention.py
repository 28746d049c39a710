"""Retention, read from the templates: the app setting the sweep reads, and the lifecycle rule
that backs it up, which deletes tiles and staging plans only, and only well after the sweep's own retention."""

from __future__ import annotations

import pytest

from tests.bicep import INFRA, Bicep
from tilecommit import jobs, settings
from tilecommit.grid import Window

MAIN = Bicep(INFRA / "main.bicep")
STORAGE = Bicep(INFRA / "modules" / "storage.bicep")


def storage_params(**main_params) -> dict:
    module = MAIN.modules["storage"].value
    return MAIN.property(MAIN.evaluate(module, {"hostingPlan": "FlexConsumption", **main_params}), "params")


def lifecycle_rule(params: dict) -> tuple[object, dict]:
    (policy,) = STORAGE.resources_of_type("Microsoft.Storage/storageAccounts/managementPolicies")
    condition = STORAGE.evaluate(policy.condition, params)
    (rule,) = STORAGE.property(STORAGE.evaluate(policy.value, params), "properties", "policy", "rules")
    return condition, rule


def test_the_lifecycle_rule_deletes_tiles_only_a_week_after_the_sweeps_retention() -> None:
    params = storage_params()
    assert MAIN.evaluate(MAIN.params["tileRetentionDays"].value) == settings.DEFAULT_TILE_RETENTION_DAYS
    assert params["tileRetentionDays"] == settings.DEFAULT_TILE_RETENTION_DAYS
    condition, rule = lifecycle_rule(params)
    assert condition is True
    prefixes = rule["definition"]["filters"]["prefixMatch"]
    # Exactly the tiles, the mosaics' staging plans and their coarse levels' intermediates: the
    # container the app writes them to, and the prefix of every tile's, plan's and intermediate's name.
    assert prefixes == [
        f"{settings.TILES_CONTAINER}/tiles/",
        f"{settings.TILES_CONTAINER}/plans/",
        f"{settings.TILES_CONTAINER}/levels/",
    ]
    assert jobs.tile_blob_name("0123456789abcdef", Window(0, 0, 0, 0, 256, 256)).startswith("tiles/")
    assert jobs.share_plan_blob_name("0123456789abcdef", "AAAAA").startswith("plans/")
    assert jobs.level_blob_name("0123456789abcdef", 2, 0, 1).startswith("levels/")
    assert settings.TILES_CONTAINER != settings.OUTPUT_CONTAINER  # mosaics are never under it
    delete = rule["definition"]["actions"]["baseBlob"]["delete"]
    assert delete == {"daysAfterModificationGreaterThan": settings.DEFAULT_TILE_RETENTION_DAYS + 7}
    assert set(rule["definition"]["actions"]) == {"baseBlob"}  # no snapshot or version rule besides


@pytest.mark.parametrize("days", [0, 30])
def test_retention_zero_keeps_every_tile_and_another_retention_moves_the_rule(days: int) -> None:
    params = storage_params(tileRetentionDays=days)
    condition, rule = lifecycle_rule(params)
    assert condition is (days > 0)
    assert rule["definition"]["actions"]["baseBlob"]["delete"]["daysAfterModificationGreaterThan"] == days + 7
