// Log Analytics + workspace-based Application Insights, both with local (key) auth disabled.
// The app sends telemetry with its managed identity: APPLICATIONINSIGHTS_AUTHENTICATION_STRING
// "ClientId=<id>;Authorization=AAD" in the app settings and the role assignment below.

param logAnalyticsName string

param applicationInsightsName string

param location string

param tags object = {}

@description('Days Log Analytics keeps the app\'s logs and telemetry (30 is included in the ingestion price).')
@minValue(30)
@maxValue(730)
param retentionInDays int = 30

@description('Daily ingestion cap in GB; -1 for none. Telemetry stops for the rest of the day once reached.')
param dailyQuotaGb int = 1

@description('Principal (object) id of the app\'s user-assigned identity.')
param principalId string

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: logAnalyticsName
  location: location
  tags: tags
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: retentionInDays
    workspaceCapping: {
      dailyQuotaGb: dailyQuotaGb
    }
    features: {
      // Queries and ingestion with Entra ID only, no workspace keys.
      disableLocalAuth: true
    }
  }
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: applicationInsightsName
  location: location
  tags: tags
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: workspace.id
    IngestionMode: 'LogAnalytics'
    // The instrumentation key in the connection string cannot ingest on its own: only Entra ID.
    DisableLocalAuth: true
  }
}

// Monitoring Metrics Publisher on this component only: lets the app's identity send telemetry
// now that local auth is off (no access to any other component or to the logs themselves).
var monitoringMetricsPublisherRoleId = '3913510d-42f4-4e42-8a64-420c390055eb'

resource telemetryPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(applicationInsights.id, principalId, monitoringMetricsPublisherRoleId)
  scope: applicationInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', monitoringMetricsPublisherRoleId)
    principalId: principalId
    principalType: 'ServicePrincipal'
    description: 'Function app identity: send telemetry to Application Insights (local auth is disabled).'
  }
}

// The operators' workbook: its queries are the .kql files beside the templates (the same files
// tests/test_telemetry.py runs over a local run's records), each shown as one item.
var workbookQueries = [
  {
    title: 'Duplicates storage refused, by gate and job'
    query: loadTextContent('../workbook/refused-duplicates-by-gate.kql')
    visualization: 'table'
  }
  {
    title: 'Jobs started, completed and failed'
    query: loadTextContent('../workbook/jobs-over-time.kql')
    visualization: 'timechart'
  }
  {
    title: 'Windows per minute'
    query: loadTextContent('../workbook/windows-per-minute.kql')
    visualization: 'timechart'
  }
  {
    title: 'Slowest jobs'
    query: loadTextContent('../workbook/slowest-jobs.kql')
    visualization: 'table'
  }
  {
    title: 'Where the time went (activity executions)'
    query: loadTextContent('../workbook/where-time-went.kql')
    visualization: 'table'
  }
  {
    title: 'Errors by type'
    query: loadTextContent('../workbook/errors-by-type.kql')
    visualization: 'barchart'
  }
  {
    title: 'Start decisions'
    query: loadTextContent('../workbook/start-decisions.kql')
    visualization: 'table'
  }
]

var workbookContent = {
  version: 'Notebook/1.0'
  items: [for (item, i) in workbookQueries: {
    type: 3
    name: 'query-${i}'
    content: {
      version: 'KqlItem/1.0'
      title: item.title
      query: item.query
      size: 0
      queryType: 0
      resourceType: 'microsoft.insights/components'
      visualization: item.visualization
      timeContext: {
        durationMs: 86400000
      }
    }
  }]
  fallbackResourceIds: [
    applicationInsights.id
  ]
  '$schema': 'https://github.com/Microsoft/Application-Insights-Workbooks/blob/master/schema/workbook.json'
}

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(applicationInsights.id, 'tilecommit-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'tilecommit: jobs, refusals, time'
    category: 'workbook'
    sourceId: applicationInsights.id
    serializedData: string(workbookContent)
  }
}

output applicationInsightsName string = applicationInsights.name
output applicationInsightsId string = applicationInsights.id
output connectionString string = applicationInsights.properties.ConnectionString
output logAnalyticsName string = workspace.name
