// The catalog's STAC API (main.bicep catalogEnabled): stac-fastapi-pgstac, the image its
// maintainers publish at a pinned version, on Azure Container Apps (consumption: billed per use,
// scaled to zero when idle), reading pgstac (postgres.bicep) as an identity of its own mapped to
// pgstac's read-only role pgstac_read by infra/catalog-migrate.sh. docs/catalog.md, "Deploying the
// catalog", says why Container Apps.
//
// The container runs infra/stac-api/launch.py (python -c): the image's app, with a database pool
// that signs in with Entra tokens of this identity, renewed before they expire.

param name string

param location string

param tags object = {}

@description('stac-fastapi-pgstac\'s image, pinned (its PyPI release of the same version is the local host\'s).')
param image string = 'ghcr.io/stac-utils/stac-fastapi-pgstac:7.2.0'

param databaseHost string

param databaseName string

@description('Log Analytics workspace the environment\'s logs go to (monitoring.bicep).')
param logAnalyticsName string

@description('A subnet delegated to Microsoft.App/environments: the API then reaches the server\'s private endpoint. Empty: no network integration.')
param infrastructureSubnetId string = ''

@description('Replicas at most (each opens up to 10 database connections; B1ms allows 50).')
@minValue(1)
@maxValue(4)
param maxReplicas int = 2

var integrated = !empty(infrastructureSubnetId)

// The identity the API signs in to pgstac as: its role is named after it (catalog-migrate.sh).
resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${name}-id'
  location: location
  tags: tags
}

resource workspace 'Microsoft.OperationalInsights/workspaces@2023-09-01' existing = {
  name: logAnalyticsName
}

resource environment 'Microsoft.App/managedEnvironments@2024-03-01' = {
  name: '${name}-env'
  location: location
  tags: tags
  properties: {
    // Logs through the diagnostic setting below, with no workspace key in the template.
    appLogsConfiguration: {
      destination: 'azure-monitor'
    }
    workloadProfiles: [
      {
        name: 'Consumption'
        workloadProfileType: 'Consumption'
      }
    ]
    vnetConfiguration: integrated ? {
      infrastructureSubnetId: infrastructureSubnetId
      // The API is searched from outside the network; only its way to the database is private.
      internal: false
    } : null
  }
}

// The environment's log categories: the containers' output and Container Apps' own events.
resource environmentLogs 'Microsoft.Insights/diagnosticSettings@2016-09-01' = {
  name: 'logs'
  scope: environment
  properties: {
    workspaceId: workspace.id
    logs: [
      {
        category: 'ContainerAppConsoleLogs'
        enabled: true
      }
      {
        category: 'ContainerAppSystemLogs'
        enabled: true
      }
    ]
  }
}

resource app 'Microsoft.App/containerApps@2024-03-01' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
    }
  }
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      ingress: {
        external: true
        targetPort: 8080
        transport: 'auto'
        allowInsecure: false
      }
    }
    template: {
      containers: [
        {
          name: 'stac-api'
          image: image
          command: [
            'python'
            '-c'
            loadTextContent('../stac-api/launch.py')
          ]
          env: [
            {
              name: 'PGHOST'
              value: databaseHost
            }
            {
              name: 'PGPORT'
              value: '5432'
            }
            {
              name: 'PGDATABASE'
              value: databaseName
            }
            {
              // The role catalog-migrate.sh creates for this identity has the identity's name.
              name: 'PGUSER'
              value: identity.name
            }
            {
              name: 'AZURE_CLIENT_ID'
              value: identity.properties.clientId
            }
          ]
          resources: {
            cpu: json('0.5')
            memory: '1Gi'
          }
        }
      ]
      scale: {
        minReplicas: 0
        maxReplicas: maxReplicas
      }
    }
  }
}

output url string = 'https://${app.properties.configuration.ingress.fqdn}'
output identityName string = identity.name
output identityPrincipalId string = identity.properties.principalId
