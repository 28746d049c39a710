// Data-plane roles on the storage account, each at the narrowest scope that works.
//
// Two identities (docs/security.md has the matrix, checked by tests/test_infra_trust_zones.py):
// - the HOST's (AzureWebJobsStorage): the Functions host, the Durable extension and the blob
//   trigger. What they need is account-wide, because they create their own containers, queues
//   and tables at run time (azure-webjobs-hosts, azure-webjobs-secrets, blob receipts, the
//   webjobs-blobtrigger-poison queue, <hub>-control-NN and <hub>-workitems queues, <hub>-leases /
//   <hub>-largemessages containers, <hub>Instances / <hub>History tables), and creating a
//   container, queue or table needs a role on the account.
// - the DATA identity (TilecommitData, tilecommit/settings.py DATA_CONNECTION): the code, which
//   parses untrusted uploads. Read on the uploads, write on the tiles and the mosaics, the
//   manifest table; nothing on the account, so nothing on the host's containers.
//
// Not granted, though the Functions docs list it for the blob trigger: Storage Account Contributor.
// It is a control-plane role (it can list keys and turn shared-key access back on). The reports
// of it being needed are for the polling blob trigger; this app's trigger uses the Event Grid
// source, and Microsoft's own Event Grid blob-trigger sample (Flex, managed identity) grants only
// Storage Blob Data Owner and Storage Queue Data Contributor. If a real deployment shows the host
// failing for lack of it, grant it here, on the account, and say why.

param storageAccountName string

@description('Principal (object) id of the function app\'s user-assigned identity.')
param appPrincipalId string

@description('Principal (object) id of the code\'s user-assigned identity (the TilecommitData connection).')
param dataPrincipalId string

@description('Container the tiles are written to.')
param tilesContainerName string

@description('The manifest table (create-only rows, one per window).')
param manifestTableName string

@description('Object id of the person or pipeline that runs infra/deploy.sh; empty for none.')
param deployerPrincipalId string = ''

@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param deployerPrincipalType string = 'User'

@description('Grant the deployer upload to the input container and read of the output container.')
param grantDeployerDataAccess bool = true

@description('Container the deployer uploads the code package to (Consumption plan); empty for none.')
param packageContainerName string = ''

@description('Container users upload rasters to.')
param inputContainerName string

@description('Container the mosaics are written to.')
param outputContainerName string

@description('Container Event Grid dead-letters undeliverable events to.')
param deadLetterContainerName string

@description('Principal (object) id of the Event Grid system topic\'s own identity, which writes the dead letters.')
param eventGridPrincipalId string

var storageBlobDataOwnerRoleId = 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
var storageBlobDataContributorRoleId = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
var storageBlobDataReaderRoleId = '2a2b9908-6ea1-4ae2-8e65-a410df84e7d1'
var storageQueueDataContributorRoleId = '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
var storageTableDataContributorRoleId = '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storageAccount
  name: 'default'
}

resource inputContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: inputContainerName
}

resource outputContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: outputContainerName
}

resource tilesContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: tilesContainerName
}

resource tableService 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' existing = {
  parent: storageAccount
  name: 'default'
}

resource manifestTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  parent: tableService
  name: manifestTableName
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deadLetterContainerName
}

resource packageContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: empty(packageContainerName) ? 'unused' : packageContainerName
}

// ---- The host's identity (account scope) ----

// Storage Blob Data Owner: the Functions host's own minimum (its key store and coordination blobs,
// containers it creates), blob receipts of the blob trigger and the upload it hands the starter,
// Durable's leases and large messages. The Flex Consumption host also reads the code package from
// the deployment container, the Consumption host from the package container
// (WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID).
resource appBlobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, appPrincipalId, storageBlobDataOwnerRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataOwnerRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Functions host, blob trigger and Durable blobs.'
  }
}

// Storage Queue Data Contributor: Durable's control and work-item queues; the blob trigger's
// internal queue and its poison queue (webjobs-blobtrigger-poison).
resource appQueueContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, appPrincipalId, storageQueueDataContributorRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageQueueDataContributorRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Durable Functions queues and the blob trigger queues.'
  }
}

// Storage Table Data Contributor: Durable's instance and history tables, the host's diagnostic
// events.
resource appTableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storageAccount.id, appPrincipalId, storageTableDataContributorRoleId)
  scope: storageAccount
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalId: appPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Durable Functions tables, host diagnostic events.'
  }
}

// ---- The data identity: the code (container and table scope) ----

// Storage Blob Data Reader on the uploads: validate_source and render_tile read the upload, pinned
// to its ETag, and a backfill lists them (List Blobs is this role's read); nothing of the code writes there.
resource dataUploadReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(inputContainer.id, dataPrincipalId, storageBlobDataReaderRoleId)
  scope: inputContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataReaderRoleId)
    principalId: dataPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The code: read the uploads.'
  }
}

// Storage Blob Data Contributor on the tiles: create-only tile commits, the reads of the assembly,
// retention's deletes, and the copy source of the mosaic's Put Block From URL (OAuth copy-source
// authorisation with this identity's token needs read on the source: no key, no SAS).
resource dataTileWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(tilesContainer.id, dataPrincipalId, storageBlobDataContributorRoleId)
  scope: tilesContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: dataPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The code: write, read and delete the tiles.'
  }
}

// Storage Blob Data Contributor on the mosaics: the staged mosaic (Put Block From URL, Put Block
// List with its condition), its STAC item and quicklook, the checks that read them back, repairs.
resource dataMosaicWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(outputContainer.id, dataPrincipalId, storageBlobDataContributorRoleId)
  scope: outputContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: dataPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The code: write and read the mosaics, STAC items and quicklooks.'
  }
}

// Storage Table Data Contributor on the manifest table only: its create-only rows, the point reads
// and queries of the assembly, the cancellation row, retention's deletes.
resource dataManifestWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(manifestTable.id, dataPrincipalId, storageTableDataContributorRoleId)
  scope: manifestTable
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageTableDataContributorRoleId)
    principalId: dataPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The code: the manifest rows.'
  }
}

// ---- Event Grid's system topic (container scope) ----

// Storage Blob Data Contributor on the dead-letter container only: the topic writes there, with
// its own identity, the events it could not deliver (event-subscription.bicep).
resource eventGridDeadLetterWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deadLetterContainer.id, eventGridPrincipalId, storageBlobDataContributorRoleId)
  scope: deadLetterContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: eventGridPrincipalId
    principalType: 'ServicePrincipal'
    description: 'Event Grid: write undeliverable BlobCreated events (dead letters).'
  }
}

// ---- The deployer (container scope), so deploy.sh and a first test work with keys off ----

// Storage Blob Data Contributor on the package container only: deploy.sh uploads the code
// package there on the Consumption plan (Flex Consumption uploads through the app instead).
resource deployerPackageWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(deployerPrincipalId) && !empty(packageContainerName)) {
  name: guid(packageContainer.id, deployerPrincipalId, storageBlobDataContributorRoleId)
  scope: packageContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: deployerPrincipalId
    principalType: deployerPrincipalType
    description: 'Deployer: upload the code package (Consumption plan).'
  }
}

// Storage Blob Data Contributor on the input container only: the deployer can upload a raster.
resource deployerUploader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(deployerPrincipalId) && grantDeployerDataAccess) {
  name: guid(inputContainer.id, deployerPrincipalId, storageBlobDataContributorRoleId)
  scope: inputContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributorRoleId)
    principalId: deployerPrincipalId
    principalType: deployerPrincipalType
    description: 'Deployer: upload rasters to the input container.'
  }
}

// Storage Blob Data Reader on the output container only: the deployer can download mosaics.
resource deployerReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(deployerPrincipalId) && grantDeployerDataAccess) {
  name: guid(outputContainer.id, deployerPrincipalId, storageBlobDataReaderRoleId)
  scope: outputContainer
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataReaderRoleId)
    principalId: deployerPrincipalId
    principalType: deployerPrincipalType
    description: 'Deployer: read the mosaics.'
  }
}
