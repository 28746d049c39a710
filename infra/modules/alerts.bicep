// Alerts on what must not pass unnoticed: an upload whose event Event Grid gave up on (it is in
// the dead-letter container, to be replayed), an event dropped for good (not even dead-lettered,
// e.g. the dead-letter container was unreachable), and a job that failed. Each fires to the
// action group given (mail, SMS, a webhook...); with none, the alerts still fire and show in
// the portal and in `az monitor alert list`, they just notify nobody.

@description('The Event Grid system topic of the storage account (events.bicep).')
param systemTopicId string

@description('The Application Insights component the app sends its telemetry to (monitoring.bicep).')
param applicationInsightsId string

@description('Action group to notify (its resource id); empty: the alerts notify nobody.')
param actionGroupId string = ''

param location string

param tags object = {}

var actions = empty(actionGroupId) ? [] : [
  {
    actionGroupId: actionGroupId
  }
]

// Event Grid metrics of a system topic, summed over the window: any count above zero alerts.
var eventGridAlerts = [
  {
    name: 'dead-lettered'
    metric: 'DeadLetteredCount'
    severity: 1
    description: 'Event Grid dead-lettered BlobCreated events: their uploads are not jobs yet. Run python -m devhost replay-dead-letters (docs/operations.md).'
  }
  {
    name: 'dropped'
    metric: 'DroppedEventCount'
    severity: 0
    description: 'Event Grid dropped BlobCreated events without dead-lettering them: their uploads are not jobs and no copy of the event is kept. Upload them again (docs/operations.md).'
  }
]

resource eventAlerts 'Microsoft.Insights/metricAlerts@2018-03-01' = [for alert in eventGridAlerts: {
  name: '${last(split(systemTopicId, '/'))}-${alert.name}'
  location: 'global'
  tags: tags
  properties: {
    description: alert.description
    severity: alert.severity
    enabled: true
    scopes: [
      systemTopicId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: alert.metric
          metricNamespace: 'Microsoft.EventGrid/systemTopics'
          metricName: alert.metric
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Total'
        }
      ]
    }
    autoMitigate: true
    actions: actions
  }
}]

// Failed jobs: the JobsFinished counter (tilecommit/observability/telemetry.py) with status "failed", as the
// workbook's errors-by-type query reads it.
resource failedJobs 'Microsoft.Insights/scheduledQueryRules@2022-06-15' = {
  name: '${last(split(applicationInsightsId, '/'))}-failed-jobs'
  location: location
  tags: tags
  properties: {
    description: 'Jobs failed (bad input or a fault that outlived its retries). python -m devhost status / the workbook\'s errors by type say which and why.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsightsId
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      allOf: [
        {
          query: loadTextContent('../alerts/failed-jobs.kql')
          timeAggregation: 'Total'
          metricMeasureColumn: 'failed'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    autoMitigate: true
    actions: {
      actionGroups: empty(actionGroupId) ? [] : [
        actionGroupId
      ]
    }
  }
}
