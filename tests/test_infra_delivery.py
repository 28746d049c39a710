"""Nothing dropped silently, read from the templates: the subscription's retry policy and
dead-letter destination, the role that lets the topic write there (and nowhere else), and the
alerts on dead-lettered and dropped events and on failed jobs."""

from __future__ import annotations

import re

from tests.bicep import INFRA, Bicep
from tilecommit import events, settings
from tilecommit.observability import telemetry

MAIN = Bicep(INFRA / "main.bicep")
SUBSCRIPTION = Bicep(INFRA / "modules" / "event-subscription.bicep")
EVENTS = Bicep(INFRA / "modules" / "events.bicep")
ROLES = Bicep(INFRA / "modules" / "storage-roles.bicep")
ALERTS = Bicep(INFRA / "modules" / "alerts.bicep")
CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"  # Storage Blob Data Contributor


def module_params(name: str) -> dict:
    return MAIN.property(MAIN.evaluate(MAIN.modules[name].value, {"hostingPlan": "FlexConsumption"}), "params")


def test_undeliverable_events_are_retried_for_a_day_then_dead_lettered_to_the_codes_container() -> None:
    assert MAIN.evaluate(MAIN.vars["deadLetterContainerName"].value) == settings.DEAD_LETTER_CONTAINER
    assert settings.DEAD_LETTER_CONTAINER in module_params("storage")["containerNames"]
    params = module_params("eventSubscription")
    assert params["deadLetterContainerName"] == settings.DEAD_LETTER_CONTAINER
    (subscription,) = SUBSCRIPTION.resources_of_type("Microsoft.EventGrid/systemTopics/eventSubscriptions")
    body = SUBSCRIPTION.evaluate(subscription.value, params)
    assert SUBSCRIPTION.property(body, "properties", "retryPolicy") == {
        "maxDeliveryAttempts": 30,
        "eventTimeToLiveInMinutes": 1440,
    }
    dead_letter = SUBSCRIPTION.property(body, "properties", "deadLetterWithResourceIdentity")
    # The account takes no keys: the topic signs in with its own identity to write dead letters.
    assert dead_letter["identity"] == {"type": "SystemAssigned"}
    assert dead_letter["deadLetterDestination"]["endpointType"] == "StorageBlob"
    assert dead_letter["deadLetterDestination"]["properties"]["blobContainerName"] == settings.DEAD_LETTER_CONTAINER
    (topic,) = EVENTS.resources_of_type("Microsoft.EventGrid/systemTopics")
    assert EVENTS.property(EVENTS.evaluate(topic.value), "identity") == {"type": "SystemAssigned"}


def test_the_topics_identity_may_write_the_dead_letter_container_and_nothing_else() -> None:
    params = module_params("storageRoles")
    assert params["deadLetterContainerName"] == settings.DEAD_LETTER_CONTAINER
    assert MAIN.text(MAIN.modules["storageRoles"].value).count("events.outputs.principalId") == 1
    granted = [
        r
        for r in ROLES.resources_of_type("Microsoft.Authorization/roleAssignments")
        if "eventGridPrincipalId" in ROLES.text(r.value)
    ]
    (assignment,) = granted  # one grant to the topic's identity
    assert "storageBlobDataContributorRoleId" in ROLES.text(assignment.value)
    body = ROLES.evaluate(assignment.value, params)
    assert ROLES.text(assignment.value).split("scope:")[1].split("\n")[0].strip() == "deadLetterContainer"
    assert ROLES.evaluate(ROLES.vars["storageBlobDataContributorRoleId"].value) == CONTRIBUTOR
    assert body["properties"]["principalType"] == "ServicePrincipal"
    (container,) = [d for d in ROLES.resources.values() if d.name == "deadLetterContainer"]
    assert container.existing and ROLES.evaluate(container.value, params)["name"] == settings.DEAD_LETTER_CONTAINER


def test_dead_lettered_and_dropped_events_and_failed_jobs_alert_the_action_group() -> None:
    params = module_params("alerts")
    assert MAIN.text(MAIN.modules["alerts"].value).count("actionGroupId: alertActionGroupId") == 1
    assert MAIN.evaluate(MAIN.params["alertActionGroupId"].value) == ""
    (metric_alerts,) = ALERTS.resources_of_type("Microsoft.Insights/metricAlerts")
    assert ALERTS.text(metric_alerts.loop_over) == "eventGridAlerts"
    metrics = {a["metric"] for a in ALERTS.evaluate(ALERTS.vars["eventGridAlerts"].value)}
    assert metrics == {"DeadLetteredCount", "DroppedEventCount"}
    (query_rule,) = ALERTS.resources_of_type("Microsoft.Insights/scheduledQueryRules")
    query = (INFRA / "alerts" / "failed-jobs.kql").read_text()
    assert "loadTextContent('../alerts/failed-jobs.kql')" in ALERTS.text(query_rule.value)
    assert f'name =~ "{telemetry.JOBS_FINISHED}"' in query and 'status) == "failed"' in query
    # An action group given is notified by every alert; none given, the alerts notify nobody.
    with_group = {
        **params,
        "actionGroupId": "/subscriptions/0/resourceGroups/rg/providers/microsoft.insights/actionGroups/ops",
    }
    assert ALERTS.evaluate(ALERTS.vars["actions"].value, with_group) == [{"actionGroupId": with_group["actionGroupId"]}]
    assert ALERTS.evaluate(ALERTS.vars["actions"].value, {**params, "actionGroupId": ""}) == []
    rule = ALERTS.evaluate(query_rule.value, with_group)
    assert rule["properties"]["actions"]["actionGroups"] == [with_group["actionGroupId"]]
    assert rule["properties"]["criteria"]["allOf"][0]["metricMeasureColumn"] == "failed"


def test_the_deploy_scripts_subscription_step_passes_every_parameter_the_module_needs() -> None:
    script = (INFRA / "deploy.sh").read_text()
    step = script[script.index("\nsubscribe() {") : script.index("\n}\n", script.index("\nsubscribe() {"))]
    passed = set(re.findall(r"(\w+)=\"\$\(output (\w+)\)\"", step))
    required = {name for name, p in SUBSCRIPTION.params.items() if p.value is None}
    assert {name for name, _ in passed} | {"functionAppName"} >= required
    assert ("deadLetterContainerName", "deadLetterContainer") in passed
    assert ("storageAccountId", "storageAccountId") in passed
    assert {output for _, output in passed} <= set(MAIN.outputs)


COMPLETION = Bicep(INFRA / "modules" / "completion-events.bicep")


def test_completion_events_go_to_a_cloudevents_topic_the_app_alone_may_publish_to() -> None:
    (topic,) = COMPLETION.resources_of_type("Microsoft.EventGrid/topics")
    properties = COMPLETION.evaluate(topic.value)["properties"]
    assert properties["inputSchema"] == "CloudEventSchemaV1_0" and properties["disableLocalAuth"] is True
    (sender,) = COMPLETION.resources_of_type("Microsoft.Authorization/roleAssignments")
    assert "scope: topic" in COMPLETION.text(sender.value) and "eventGridDataSenderRoleId" in COMPLETION.text(
        sender.value
    )
    # The code publishes, with the data identity (docs/security.md).
    assert MAIN.text(MAIN.modules["completionEvents"].value).count("dataIdentity.properties.principalId") == 1
    (webhook,) = COMPLETION.resources_of_type("Microsoft.EventGrid/topics/eventSubscriptions")
    assert COMPLETION.evaluate(webhook.condition, {"webhookUrl": ""}) is False
    assert COMPLETION.evaluate(webhook.condition, {"webhookUrl": "https://example.org/hook"}) is True
    body = COMPLETION.evaluate(webhook.value, {"webhookUrl": "https://example.org/hook"})["properties"]
    assert body["filter"]["includedEventTypes"] == [events.COMPLETED, events.FAILED]
    assert body["eventDeliverySchema"] == "CloudEventSchemaV1_0"
    assert "secure" in MAIN.params["completionWebhookUrl"].decorators  # a webhook URL may carry a key
