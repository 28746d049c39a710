"""`azd up` over the same template: azure.yaml against azd's schema (as tests/fixtures/schemas
transcribes it), the azd conventions in main.bicep (tags, outputs), and the postdeploy hook, run
for real in its dry-run mode, which prints the az commands it would run. azd itself is not
installed here, so nothing here runs azd."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.bicep import INFRA, REPO_ROOT, Bicep
from tilecommit import settings

AZURE_YAML = REPO_ROOT / "azure.yaml"
SCHEMA = json.loads((REPO_ROOT / "tests" / "fixtures" / "schemas" / "azure.yaml-v1.0-subset.json").read_text())
HOOK = INFRA / "hooks" / "postdeploy.sh"
MAIN = Bicep(INFRA / "main.bicep")
SUBSCRIPTION = Bicep(INFRA / "modules" / "event-subscription.bicep")


def azure_yaml() -> dict[str, Any]:
    return yaml.safe_load(AZURE_YAML.read_text())


def schema_errors(document: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft201909Validator(SCHEMA)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_azure_yaml_follows_azds_schema_and_the_quickstarts_layout() -> None:
    jsonschema.Draft201909Validator.check_schema(SCHEMA)
    document = azure_yaml()
    assert schema_errors(document) == []
    assert document["infra"] == {"provider": "bicep", "path": "infra", "module": "main"}
    assert document["services"] == {"api": {"project": ".", "language": "python", "host": "function"}}
    assert (REPO_ROOT / document["infra"]["path"] / f"{document['infra']['module']}.bicep").is_file()
    assert (REPO_ROOT / document["infra"]["path"] / f"{document['infra']['module']}.parameters.json").is_file()
    hook = document["hooks"]["postdeploy"]
    assert hook["shell"] == "sh" and (REPO_ROOT / hook["run"]) == HOOK
    # azd runs a hook's path itself on Linux and macOS: it must be executable, with its shebang.
    assert os.access(HOOK, os.X_OK) and HOOK.read_text().startswith("#!/usr/bin/env bash\n")


BROKEN = {
    "name with capitals": lambda d: d.update(name="TileCommit"),
    "service without host": lambda d: d["services"]["api"].pop("host"),
    "no service": lambda d: d.update(services={}),
    "provider in capitals": lambda d: d["infra"].update(provider="Bicep"),
    "hook key azd does not know": lambda d: d["hooks"]["postdeploy"].update(script="x.sh"),
    "hook shell azd does not run": lambda d: d["hooks"]["postdeploy"].update(shell="bash"),
    "hook with a shell and no run": lambda d: d["hooks"]["postdeploy"].pop("run"),
    "hook event azd does not fire": lambda d: d["hooks"].update(afterdeploy=d["hooks"]["postdeploy"]),
}


@pytest.mark.parametrize("breakage", BROKEN.values(), ids=BROKEN.keys())
def test_the_schema_refuses_what_azd_refuses(breakage) -> None:
    document = copy.deepcopy(azure_yaml())
    breakage(document)
    assert schema_errors(document) != []


def test_main_bicep_tags_and_outputs_follow_azds_conventions() -> None:
    service = next(iter(azure_yaml()["services"]))
    assert MAIN.evaluate(MAIN.vars["azdServiceName"].value) == service
    # azd finds the app to deploy `api` to by this tag, and everything of the environment by the other.
    assert "union(resourceTags, { 'azd-service-name': azdServiceName })" in MAIN.text(
        MAIN.resources["functionApp"].value
    )
    assert "'azd-env-name': environmentName" in MAIN.text(MAIN.vars["resourceTags"].value)
    assert MAIN.evaluate(MAIN.vars["resourceTags"].value, {"environmentName": ""}) == {}  # deploy.sh: no tag
    untagged = [
        d.name
        for d in [*MAIN.resources.values(), *MAIN.modules.values()]
        if "tags:" in MAIN.text(d.value) and "resourceTags" not in MAIN.text(d.value)
    ]
    assert untagged == []
    for name in ("AZURE_LOCATION", "AZURE_TENANT_ID", "AZURE_RESOURCE_GROUP", "AZURE_FUNCTION_APP_NAME"):
        assert name in MAIN.outputs
    assert MAIN.text(MAIN.outputs["SERVICE_API_NAME"].value) == "functionApp.name"


def outputs_as_azd_keeps_them() -> dict[str, str]:
    """Every output of main.bicep under its own name, with values a deployment could have."""
    values = {name: f"{name}-value" for name in MAIN.outputs}
    values.update(
        AZURE_RESOURCE_GROUP="rg-azd",
        functionAppName="tilecommit-func-abc",
        functionAppHostName="tilecommit-func-abc.azurewebsites.net",
        storageAccountName="sttilecommitabc",
        storageAccountId="/subscriptions/0000/resourceGroups/rg-azd/providers/Microsoft.Storage/storageAccounts/sttilecommitabc",
        eventSubscriptionName=MAIN.evaluate(MAIN.vars["eventSubscriptionName"].value),
        systemTopicName="tilecommit-evgt-abc",
        triggerFunctionName=settings.TRIGGER_FUNCTION,
        inputContainer=settings.INPUT_CONTAINER,
        deadLetterContainer=settings.DEAD_LETTER_CONTAINER,
    )
    return values


def run_hook(**env: str) -> subprocess.CompletedProcess[str]:
    # No az on PATH: a dry run must not need it, let alone call it.
    environment = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **env}
    return subprocess.run([str(HOOK)], capture_output=True, text=True, timeout=60, env=environment, cwd=REPO_ROOT)


def az_commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line)[1:] for line in stdout.splitlines() if line.startswith("az ")]


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_postdeploy_hook_dry_run_subscribes_the_trigger_as_deploy_sh_does() -> None:
    outputs = outputs_as_azd_keeps_them()
    result = run_hook(TILECOMMIT_DRY_RUN="1", **outputs)
    assert result.returncode == 0, result.stderr
    commands = az_commands(result.stdout)
    # Only step 3: ask for the webhook key, then deploy the subscription alone.
    assert [c[:3] for c in commands] == [["functionapp", "keys", "list"], ["deployment", "group", "create"]]
    keys, deployment = commands
    assert option(keys, "--name") == outputs["functionAppName"] and option(keys, "--resource-group") == "rg-azd"
    assert option(keys, "--query") == "systemKeys.blobs_extension != `null`"  # asks, never prints the key
    assert option(deployment, "--resource-group") == "rg-azd"
    assert Path(option(deployment, "--template-file")) == INFRA / "modules" / "event-subscription.bicep"
    start = deployment.index("--parameters") + 1
    parameters = dict(p.split("=", 1) for p in deployment[start : deployment.index("--output")])
    assert parameters == {
        "name": "raster-uploaded-blob-created",
        "systemTopicName": outputs["systemTopicName"],
        "functionAppName": outputs["functionAppName"],
        "triggerFunctionName": settings.TRIGGER_FUNCTION,
        "inputContainerName": settings.INPUT_CONTAINER,
        "storageAccountId": outputs["storageAccountId"],
        "deadLetterContainerName": settings.DEAD_LETTER_CONTAINER,
    }
    # What those parameters deploy: the same subscription deploy.sh's tests read from the template.
    (subscription,) = SUBSCRIPTION.resources_of_type("Microsoft.EventGrid/systemTopics/eventSubscriptions")
    body = SUBSCRIPTION.evaluate(subscription.value, parameters)
    assert body["name"] == "raster-uploaded-blob-created"
    url = body["properties"]["destination"]["properties"]["endpointUrl"]
    assert f"/runtime/webhooks/blobs?functionName=Host.Functions.{settings.TRIGGER_FUNCTION}&code=" in url
    event_filter = body["properties"]["filter"]
    assert event_filter["includedEventTypes"] == ["Microsoft.Storage.BlobCreated"]
    assert event_filter["subjectBeginsWith"] == f"/blobServices/default/containers/{settings.INPUT_CONTAINER}/"
    destination = body["properties"]["deadLetterWithResourceIdentity"]["deadLetterDestination"]["properties"]
    assert destination == {
        "resourceId": outputs["storageAccountId"],
        "blobContainerName": settings.DEAD_LETTER_CONTAINER,
    }
    assert body["properties"]["retryPolicy"] == {"maxDeliveryAttempts": 30, "eventTimeToLiveInMinutes": 1440}


def test_postdeploy_hook_says_what_azd_did_not_give_it() -> None:
    outputs = outputs_as_azd_keeps_them()
    del outputs["AZURE_RESOURCE_GROUP"]  # main.bicep's output, which azd keeps too
    result = run_hook(TILECOMMIT_DRY_RUN="1", **outputs)
    assert result.returncode == 1 and "AZURE_RESOURCE_GROUP" in result.stderr
    del outputs["systemTopicName"]
    result = run_hook(TILECOMMIT_DRY_RUN="1", AZURE_RESOURCE_GROUP="rg-azd", **outputs)
    assert result.returncode == 1 and "no systemTopicName in the environment" in result.stderr
    assert az_commands(result.stdout) == []


def test_azds_local_files_are_not_deployed() -> None:
    # azd keeps each environment's values in .azure/<env>/.env, inside the project it publishes.
    ignored = {line.strip() for line in (REPO_ROOT / ".funcignore").read_text().splitlines()}
    assert {".azure/", "azure.yaml"} <= ignored
    assert ".azure/" in (REPO_ROOT / ".gitignore").read_text().splitlines()
