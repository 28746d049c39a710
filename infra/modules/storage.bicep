// The one storage account of the app: host and Durable state (AzureWebJobsStorage), the app's own
// containers and tables, and (Flex Consumption) the deployment container / (Consumption) the
// package container. Keys are off: every client, the Functions host included, signs in with Entra ID.
// With privateEndpointsOnly (main.bicep vnetEnabled), only the private endpoints and trusted Azure
// services reach it.

@description('Storage account name (3-24 lower-case letters and digits, globally unique).')
@minLength(3)
@maxLength(24)
param name string

param location string

param tags object = {}

@description('Blob containers to create (the app\'s input, tiles and output containers and the code package container).')
param containerNames array

@description('Tables to create (the manifest table).')
param tableNames array

@description('Redundancy. LRS: three copies in one datacenter, cheapest; tiles and mosaics can be made again from the inputs.')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param skuName string = 'Standard_LRS'

@description('The public endpoint refuses every network but trusted Azure services (Event Grid writing dead letters); the app comes in through private endpoints (storage-private-endpoints.bicep). False: every network, Entra-only.')
param privateEndpointsOnly bool = false

@description('Days a deleted blob or container can be restored (soft delete).')
@minValue(1)
@maxValue(365)
param softDeleteRetentionDays int = 7

@description('The container the tiles are in; its tiles/ prefix is what the lifecycle rule deletes.')
param tilesContainerName string = ''

@description('Days a finished job keeps its tiles (the app\'s retention sweep); 0: forever, and no lifecycle rule.')
@minValue(0)
param tileRetentionDays int = 0

@description('Days the lifecycle rule waits past the retention before it deletes a tile the sweep has not: a backstop for a sweep that did not run, late enough never to race a sweep that does (it runs daily).')
param tileBackstopDays int = 7

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: skuName
  }
  kind: 'StorageV2'
  properties: {
    accessTier: 'Hot'
    // No account keys and no SAS signed with them: Entra ID (managed identity / az login) only.
    allowSharedKeyAccess: false
    // The portal and the CLI then default to Entra ID as well.
    defaultToOAuthAuthentication: true
    // No anonymous read access to any container.
    allowBlobPublicAccess: false
    allowCrossTenantReplication: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    // Public endpoint on in both cases (checkov-skips.toml CKV_AZURE_59): Event Grid writes dead
    // letters through it as a trusted Azure service, and network rules, that exception among them,
    // only govern a public endpoint that is on. Without privateEndpointsOnly: every network, Entra-only
    // (CKV_AZURE_35); the Consumption-plan workers and the users uploading have no fixed network.
    publicNetworkAccess: 'Enabled'
    networkAcls: {
      bypass: 'AzureServices'
      defaultAction: privateEndpointsOnly ? 'Deny' : 'Allow'
    }
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: {
          enabled: true
          keyType: 'Account'
        }
        file: {
          enabled: true
          keyType: 'Account'
        }
        queue: {
          enabled: true
          keyType: 'Account'
        }
        table: {
          enabled: true
          keyType: 'Account'
        }
      }
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storageAccount
  name: 'default'
  properties: {
    // A deleted tile, mosaic or input can be restored for a few days; the app never deletes them.
    deleteRetentionPolicy: {
      enabled: true
      days: softDeleteRetentionDays
    }
    containerDeleteRetentionPolicy: {
      enabled: true
      days: softDeleteRetentionDays
    }
  }
}

resource containers 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = [for containerName in containerNames: {
  parent: blobService
  name: containerName
  properties: {
    publicAccess: 'None'
  }
}]

// The backstop of the retention sweep (client_functions/retention.py): tiles and the mosaics'
// staging plans (both in the tiles container) only, never mosaics,
// never anything younger than the retention plus the slack. The sweep deletes a job's rows
// before its tiles; this rule cannot, so it waits long enough that the sweep has come first.
resource tileLifecycle 'Microsoft.Storage/storageAccounts/managementPolicies@2023-05-01' = if (tileRetentionDays > 0) {
  parent: storageAccount
  name: 'default'
  properties: {
    policy: {
      rules: [
        {
          name: 'delete-old-tiles'
          enabled: true
          type: 'Lifecycle'
          definition: {
            filters: {
              blobTypes: [
                'blockBlob'
              ]
              prefixMatch: [
                '${tilesContainerName}/tiles/'
                '${tilesContainerName}/plans/'
                '${tilesContainerName}/levels/'
              ]
            }
            actions: {
              baseBlob: {
                delete: {
                  daysAfterModificationGreaterThan: tileRetentionDays + tileBackstopDays
                }
              }
            }
          }
        }
      ]
    }
  }
  dependsOn: [
    containers
  ]
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: storageAccount
  name: 'default'
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = [for tableName in tableNames: {
  parent: tableService
  name: tableName
}]

output id string = storageAccount.id
output name string = storageAccount.name
output location string = storageAccount.location
output blobEndpoint string = storageAccount.properties.primaryEndpoints.blob
output queueEndpoint string = storageAccount.properties.primaryEndpoints.queue
output tableEndpoint string = storageAccount.properties.primaryEndpoints.table
