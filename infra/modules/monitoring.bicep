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

output applicationInsightsName string = applicationInsights.name
output applicationInsightsId string = applicationInsights.id
output connectionString string = applicationInsights.properties.ConnectionString
output logAnalyticsName string = workspace.name
