// tilecommit: an Azure Functions app (Python 3.13 on Flex Consumption, 3.11 on Consumption; v2
// model, Durable) that turns uploaded rasters into COG tiles and a mosaic. Deployed two ways (docs/deployment.md), both over this one
// template: `azd up` (azure.yaml; azd fills main.parameters.json's ${...} values and runs
// infra/hooks/postdeploy.sh once the code is published), or infra/deploy.sh with the Azure CLI alone.
// Either way the Event Grid subscription is deployed last, on its own
// (modules/event-subscription.bicep), because it needs the webhook key that the code creates.
//
// Names shared with the code live in tilecommit/settings.py; the literals below must equal them
// and tests/test_infra_agreement.py fails until they do.

targetScope = 'resourceGroup'

// ---------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------

@description('Region of every resource. Flex Consumption is not in every region: az functionapp list-flexconsumption-locations.')
param location string = resourceGroup().location

@description('Prefix of the resource names (lower-case letters, digits, hyphens).')
@minLength(3)
@maxLength(12)
param baseName string = 'tilecommit'

@description('FlexConsumption (FC1): recommended for new apps, Event Grid blob source, instance memory of your choice. Consumption (Y1, Linux): legacy, retires 30 Sep 2028.')
@allowed([
  'FlexConsumption'
  'Consumption'
])
param hostingPlan string = 'FlexConsumption'

// Python 3.13 runs the language worker of azure-functions-runtime, which the local host drives
// (docs/local-host.md); requirements.txt's markers pick its packages. Linux Consumption stays on
// 3.11. Empty: the plan's version. As with vnetEnabled, ARM cannot refuse 3.13 on Consumption;
// infra/deploy.sh refuses --python 3.13 with --plan consumption.
@description('The app\'s Python: 3.13 on Flex Consumption, 3.11 on Consumption (Y1). Empty: the plan\'s (3.13 on Flex Consumption, 3.11 on Consumption).')
@allowed([
  ''
  '3.11'
  '3.13'
])
param pythonVersion string = ''

// ARM has no way to reject one parameter because of another (Bicep's fail() would, but checkov
// cannot parse it), so with Consumption the option is ignored and the output networkIsolated says
// so; infra/deploy.sh refuses --vnet with --plan consumption before anything is deployed.
@description('Flex Consumption only (ignored on Consumption, which has no VNet integration): a virtual network the app\'s outbound traffic goes through, private endpoints and DNS zones for the storage account\'s blob, queue and table services, and the account\'s public endpoint closed to all but trusted Azure services (Event Grid writing dead letters). The app\'s own endpoint stays public: Event Grid delivers to it.')
param vnetEnabled bool = false

// host.json names the Azure Storage provider's settings; the app settings below switch it to the
// scheduler (azureManaged), so one code package runs on either backend. docs/deployment.md, "The Durable
// backend", says what changes and what does not.
@description('Where Durable keeps its task hub: AzureStorage (the storage account: queues, tables, leases; the default) or DurableTaskScheduler (a Durable Task Scheduler and task hub, Microsoft\'s recommended backend for throughput; the host\'s identity holds Durable Task Data Contributor on that task hub only).')
@allowed([
  'AzureStorage'
  'DurableTaskScheduler'
])
param durableBackend string = 'AzureStorage'

@description('durableBackend DurableTaskScheduler only: the scheduler\'s SKU, Consumption (per action, scales to zero) or Dedicated (one capacity unit, bought ahead).')
@allowed([
  'Consumption'
  'Dedicated'
])
param durableTaskSchedulerSku string = 'Consumption'

@description('azd environment name (azd sets it from AZURE_ENV_NAME): tags every resource azd-env-name=<name>, the tag azd finds its resources by. Empty (infra/deploy.sh): no such tag.')
@maxLength(64)
param environmentName string = ''

@description('Flex Consumption only: memory of each instance in MB. A 1024-px window needs about 115 MB a worker; the mosaic assembly about 300 MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

// Flex Consumption's bounds for the maximum instance count are 1 to 1000 (the preview's lowest was
// 40); it applies to each per-function scale group (MicrosoftDocs/azure-docs,
// articles/azure-functions/event-driven-scaling.md, "Limit scale-out").
@description('Flex Consumption only: most instances the app scales out to (bounds the cost of an upload storm).')
@minValue(1)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('The catalog (docs/catalog.md): Azure Database for PostgreSQL Flexible Server with pgstac (Burstable B1ms, Microsoft Entra authentication only, the deployer its Entra administrator) that each finished job is published to, and the STAC API (stac-fastapi-pgstac on Azure Container Apps) that searches it. Off: collections in blob storage only, no database.')
param catalogEnabled bool = false

@description('catalogEnabled only: the deployer\'s name in Entra ID (user principal name, or the group\'s or application\'s display name), for deployerPrincipalId as the server\'s Entra administrator.')
param catalogAdministratorName string = ''

@description('Second step of infra/deploy.sh: create the Event Grid subscription (needs the code deployed).')
param deployEventSubscription bool = false

@description('Object id of whoever runs the deployment: (Consumption) upload of the code package and, with grantDeployerDataAccess, upload to the input and read of the output container. Empty for none.')
param deployerPrincipalId string = ''

@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param deployerPrincipalType string = 'User'

@description('Grant the deployer upload to the input container and read of the output container (not only the package upload).')
param grantDeployerDataAccess bool = true

@description('TILECOMMIT_WINDOW_SIZE: tile window in pixels, a multiple of 256.')
@minValue(256)
param windowSize int = 1024

@description('TILECOMMIT_BATCH_SIZE: windows per sub-orchestration.')
@minValue(1)
@maxValue(1000)
param batchSize int = 64

@description('TILECOMMIT_MAX_PIXELS: larger scenes are refused before any tile is written.')
@minValue(1)
param maxPixels int = 1677721600

@description('TILECOMMIT_GDAL_CACHEMAX_MB and GDAL_CACHEMAX: GDAL block cache per process in MB.')
@minValue(1)
param gdalCacheMaxMb int = 64

@description('TILECOMMIT_ASSEMBLY_SHARE_MB: MiB of tiles one activity stages into the mosaic; more are staged in shares.')
@minValue(1)
@maxValue(2400)
param assemblyShareMb int = 2400

@description('TILECOMMIT_TILE_RETENTION_DAYS: days a finished job keeps its tiles, manifest rows and Durable history (the daily retention_sweep function purges them; its mosaic, STAC item and quicklook stay). 0: kept forever.')
@minValue(0)
param tileRetentionDays int = 7

@description('TILECOMMIT_PROFILE: the output profile of uploads whose metadata names none and that match no rule: default (DEFLATE), zstd, lzw, raw, jpeg, webp, lerc, lerc_deflate or lerc_zstd, optionally with ,level=N ,predictor=N ,quality=N ,max_z_error=X (docs/configuration.md, "Output profiles").')
param outputProfile string = 'default'

@description('TILECOMMIT_PROFILE_RULES: profiles by upload path, prefix=profile[,key=value...] separated by semicolons (e.g. dem/=zstd,predictor=3;previews/=lzw); the longest prefix wins. Empty: none.')
param profileRules string = ''

@description('TILECOMMIT_COLLECTION: the collection of uploads whose metadata (tilecommit_collection) names none and that match no rule: 1 to 64 characters of a-z, 0-9, - and _, beginning with a letter or a digit (docs/catalog.md).')
param collectionId string = 'tilecommit'

@description('TILECOMMIT_COLLECTION_RULES: collections by upload path, prefix=collection separated by semicolons (e.g. dem/=elevation;previews/=quicklooks); the longest prefix wins. Empty: none.')
param collectionRules string = ''

@description('Storage redundancy (see infra/checkov-skips.toml, CKV_AZURE_206).')
@allowed([
  'Standard_LRS'
  'Standard_ZRS'
  'Standard_GRS'
  'Standard_GZRS'
])
param storageSku string = 'Standard_LRS'

@description('Days Log Analytics keeps logs and telemetry.')
@minValue(30)
@maxValue(730)
param logRetentionDays int = 30

@description('Log Analytics daily ingestion cap in GB (-1: none).')
param logDailyQuotaGb int = 1

@description('A webhook that receives every job\'s completion event (CloudEvents 1.0, from the completion-events topic); empty: none.')
@secure()
param completionWebhookUrl string = ''

@description('Action group (resource id) the alerts notify: dead-lettered or dropped upload events, failed jobs. Empty: the alerts fire but notify nobody.')
param alertActionGroupId string = ''

param tags object = {}

// ---------------------------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------------------------

// Shared with the code: tilecommit/settings.py.
var inputContainerName = 'raster-uploads' // INPUT_CONTAINER
var tilesContainerName = 'raster-tiles' // TILES_CONTAINER
var outputContainerName = 'raster-mosaics' // OUTPUT_CONTAINER
var deadLetterContainerName = 'eventgrid-deadletter' // DEAD_LETTER_CONTAINER
var manifestTableName = 'tilemanifest' // MANIFEST_TABLE
var triggerFunctionName = 'raster_uploaded' // TRIGGER_FUNCTION

// Infrastructure only. Flex Consumption keeps its deployment packages in this container; on
// Consumption deploy.sh uploads the package here and the app runs it from its URL.
var packageContainerName = 'app-package'
var packageBlobName = 'tilecommit.zip'

var isFlex = hostingPlan == 'FlexConsumption'
var appPythonVersion = !empty(pythonVersion) ? pythonVersion : (isFlex ? '3.13' : '3.11')
var useScheduler = durableBackend == 'DurableTaskScheduler'
// host.json's extensions.durableTask.hubName: the scheduler's task hub has the same name.
var taskHubName = 'TileCommitHub'
// The app setting the azureManaged provider reads its connection from (host.json override below).
var schedulerConnectionSetting = 'DURABLE_TASK_SCHEDULER_CONNECTION_STRING'
var networkIsolated = vnetEnabled && isFlex
// azd's conventions: azd-env-name on everything, azd-service-name on the app it deploys the
// service `api` (azure.yaml) to.
var resourceTags = empty(environmentName) ? tags : union(tags, { 'azd-env-name': environmentName })
var azdServiceName = 'api'
var token = uniqueString(resourceGroup().id, baseName)
var storageAccountName = take('st${replace(toLower(baseName), '-', '')}${token}', 24)
var functionAppName = '${baseName}-func-${token}'
var planName = '${baseName}-plan-${token}'
var identityName = '${baseName}-id-${token}'
var dataIdentityName = '${baseName}-data-id-${token}'
var logAnalyticsName = '${baseName}-log-${token}'
var applicationInsightsName = '${baseName}-appi-${token}'
var systemTopicName = '${baseName}-evgt-${token}'
var completionTopicName = '${baseName}-evt-${token}'
var virtualNetworkName = '${baseName}-vnet-${token}'
var schedulerName = '${baseName}-dts-${token}'
var postgresName = '${baseName}-pg-${token}'
var stacApiName = '${baseName}-stac-${token}'
// pgstac's database and port (tilecommit/settings.py DEFAULT_PGSTAC_DATABASE, DEFAULT_PGSTAC_PORT).
var catalogDatabaseName = 'pgstac'
var catalogPort = 5432
var eventSubscriptionName = '${replace(triggerFunctionName, '_', '-')}-blob-created'

// ---------------------------------------------------------------------------------------------
// Identity, storage, monitoring, roles
// ---------------------------------------------------------------------------------------------

// User-assigned rather than system-assigned: it exists before the app, so its role assignments
// are made (and have time to propagate) before the host first starts; no app -> role -> app cycle;
// it survives re-creating the app (e.g. moving to another plan); and the host's storage
// connection (AzureWebJobsStorage__clientId), the Flex deployment storage and the Consumption
// package download (WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID) can all name it.
resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: identityName
  location: location
  tags: resourceTags
}

// The code's identity (the TilecommitData connection, tilecommit/settings.py DATA_CONNECTION):
// the one the raster code, which parses untrusted uploads, signs in to storage and Event Grid
// with. Its roles are scoped to the app's own containers, manifest table and topic, so it cannot
// read or write what the host keeps in the same account (azure-webjobs-secrets, the task hub,
// the code package). docs/security.md has the matrix and what this buys and does not.
resource dataIdentity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: dataIdentityName
  location: location
  tags: resourceTags
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: {
    name: storageAccountName
    location: location
    tags: resourceTags
    skuName: storageSku
    containerNames: [
      inputContainerName
      tilesContainerName
      outputContainerName
      deadLetterContainerName
      packageContainerName
    ]
    tableNames: [
      manifestTableName
    ]
    privateEndpointsOnly: networkIsolated
    tilesContainerName: tilesContainerName
    tileRetentionDays: tileRetentionDays
  }
}

// ---------------------------------------------------------------------------------------------
// Network isolation (vnetEnabled, Flex Consumption only)
// ---------------------------------------------------------------------------------------------

module virtualNetwork 'modules/vnet.bicep' = if (networkIsolated) {
  name: 'virtual-network'
  params: {
    name: virtualNetworkName
    location: location
    tags: resourceTags
  }
}

module storagePrivateEndpoints 'modules/storage-private-endpoints.bicep' = if (networkIsolated) {
  name: 'storage-private-endpoints'
  params: {
    storageAccountName: storage.outputs.name
    virtualNetworkId: networkIsolated ? virtualNetwork.outputs.id : ''
    subnetId: networkIsolated ? virtualNetwork.outputs.privateEndpointSubnetId : ''
    location: location
    tags: resourceTags
  }
}

// ---------------------------------------------------------------------------------------------
// Durable Task Scheduler (durableBackend DurableTaskScheduler)
// ---------------------------------------------------------------------------------------------

module durableTaskScheduler 'modules/durable-task-scheduler.bicep' = if (useScheduler) {
  name: 'durable-task-scheduler'
  params: {
    name: schedulerName
    location: location
    tags: resourceTags
    taskHubName: taskHubName
    skuName: durableTaskSchedulerSku
    hostPrincipalId: identity.properties.principalId
  }
}

// ---------------------------------------------------------------------------------------------
// The catalog (catalogEnabled): pgstac on PostgreSQL and the STAC API reading it
// ---------------------------------------------------------------------------------------------

module postgres 'modules/postgres.bicep' = if (catalogEnabled) {
  name: 'postgres'
  params: {
    name: postgresName
    location: location
    tags: resourceTags
    databaseName: catalogDatabaseName
    administratorObjectId: deployerPrincipalId
    administratorName: catalogAdministratorName
    administratorType: deployerPrincipalType
    privateAccess: networkIsolated
    virtualNetworkId: networkIsolated ? virtualNetwork.outputs.id : ''
    privateEndpointSubnetId: networkIsolated ? virtualNetwork.outputs.privateEndpointSubnetId : ''
  }
}

module stacApi 'modules/stac-api.bicep' = if (catalogEnabled) {
  name: 'stac-api'
  params: {
    name: stacApiName
    location: location
    tags: resourceTags
    databaseHost: catalogEnabled ? postgres.outputs.fqdn : ''
    databaseName: catalogDatabaseName
    logAnalyticsName: monitoring.outputs.logAnalyticsName
    infrastructureSubnetId: networkIsolated ? virtualNetwork.outputs.stacApiSubnetId : ''
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: {
    logAnalyticsName: logAnalyticsName
    applicationInsightsName: applicationInsightsName
    location: location
    tags: resourceTags
    retentionInDays: logRetentionDays
    dailyQuotaGb: logDailyQuotaGb
    principalId: identity.properties.principalId
  }
}

module storageRoles 'modules/storage-roles.bicep' = {
  name: 'storage-roles'
  params: {
    storageAccountName: storage.outputs.name
    appPrincipalId: identity.properties.principalId
    dataPrincipalId: dataIdentity.properties.principalId
    tilesContainerName: tilesContainerName
    manifestTableName: manifestTableName
    deployerPrincipalId: deployerPrincipalId
    deployerPrincipalType: deployerPrincipalType
    grantDeployerDataAccess: grantDeployerDataAccess
    packageContainerName: isFlex ? '' : packageContainerName
    inputContainerName: inputContainerName
    outputContainerName: outputContainerName
    deadLetterContainerName: deadLetterContainerName
    eventGridPrincipalId: events.outputs.principalId
  }
}

// ---------------------------------------------------------------------------------------------
// The function app
// ---------------------------------------------------------------------------------------------

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: planName
  location: location
  tags: resourceTags
  kind: isFlex ? 'functionapp' : 'linux'
  sku: isFlex ? {
    name: 'FC1'
    tier: 'FlexConsumption'
  } : {
    name: 'Y1'
    tier: 'Dynamic'
  }
  properties: {
    // Linux.
    reserved: true
  }
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: functionAppName
  location: location
  tags: union(resourceTags, { 'azd-service-name': azdServiceName })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identity.id}': {}
      '${dataIdentity.id}': {}
    }
  }
  properties: {
    serverFarmId: plan.id
    reserved: true
    httpsOnly: true
    clientAffinityEnabled: false
    // Outbound only: the host reaches storage through the private endpoints; inbound stays public.
    virtualNetworkSubnetId: networkIsolated ? virtualNetwork.outputs.appSubnetId : null
    functionAppConfig: isFlex ? {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.outputs.blobEndpoint}${packageContainerName}'
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identity.id
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: maximumInstanceCount
        instanceMemoryMB: instanceMemoryMB
      }
      runtime: {
        name: 'python'
        version: appPythonVersion
      }
    } : null
    siteConfig: {
      // Flex Consumption takes its runtime from functionAppConfig.runtime and rejects this one.
      linuxFxVersion: isFlex ? null : 'Python|${appPythonVersion}'
      minTlsVersion: '1.2'
      scmMinTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
      // Identity-based connections only: no connection string, account key, SAS or
      // instrumentation key (infra/checks CKV_TILECOMMIT_3 and _4). The settings are written out
      // here, not in a variable, so that checkov's checks see them.
      appSettings: concat([
        // The host, Durable and the code (tilecommit/storage.py) share this one connection.
        {
          name: 'AzureWebJobsStorage__blobServiceUri'
          value: storage.outputs.blobEndpoint
        }
        {
          name: 'AzureWebJobsStorage__queueServiceUri'
          value: storage.outputs.queueEndpoint
        }
        {
          name: 'AzureWebJobsStorage__tableServiceUri'
          value: storage.outputs.tableEndpoint
        }
        {
          name: 'AzureWebJobsStorage__credential'
          value: 'managedidentity'
        }
        {
          // Durable Functions takes the user-assigned identity by client id (not by resource id).
          name: 'AzureWebJobsStorage__clientId'
          value: identity.properties.clientId
        }
        // The code's own connection (tilecommit/storage.py StorageConnection.for_data): the same
        // account, the data identity. No queue: the code uses none.
        {
          name: 'TilecommitData__blobServiceUri'
          value: storage.outputs.blobEndpoint
        }
        {
          name: 'TilecommitData__tableServiceUri'
          value: storage.outputs.tableEndpoint
        }
        {
          name: 'TilecommitData__credential'
          value: 'managedidentity'
        }
        {
          name: 'TilecommitData__clientId'
          value: dataIdentity.properties.clientId
        }
        {
          // Names the identity for azure-identity's DefaultAzureCredential anywhere in the code:
          // the data identity, the least privileged of the two.
          name: 'AZURE_CLIENT_ID'
          value: dataIdentity.properties.clientId
        }
        {
          // Identifies the component; it cannot authenticate, since local auth is off (Entra only).
          name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
          value: monitoring.outputs.connectionString
        }
        {
          name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
          value: 'ClientId=${identity.properties.clientId};Authorization=AAD'
        }
        {
          // The worker streams its own OpenTelemetry (function_app.py configures the Azure Monitor
          // distro with the identity), so the host stops forwarding the worker's logs: each once.
          // Not PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY: the worker would configure the distro itself.
          name: 'PYTHON_ENABLE_OPENTELEMETRY'
          value: 'true'
        }
        // What the code reads (tilecommit/settings.py APP_SETTINGS), with its defaults.
        {
          name: 'TILECOMMIT_INPUT_CONTAINER'
          value: inputContainerName
        }
        {
          name: 'TILECOMMIT_TILES_CONTAINER'
          value: tilesContainerName
        }
        {
          name: 'TILECOMMIT_OUTPUT_CONTAINER'
          value: outputContainerName
        }
        {
          name: 'TILECOMMIT_MANIFEST_TABLE'
          value: manifestTableName
        }
        {
          name: 'TILECOMMIT_WINDOW_SIZE'
          value: string(windowSize)
        }
        {
          name: 'TILECOMMIT_BATCH_SIZE'
          value: string(batchSize)
        }
        {
          name: 'TILECOMMIT_MAX_PIXELS'
          value: string(maxPixels)
        }
        {
          name: 'TILECOMMIT_GDAL_CACHEMAX_MB'
          value: string(gdalCacheMaxMb)
        }
        {
          name: 'TILECOMMIT_ASSEMBLY_SHARE_MB'
          value: string(assemblyShareMb)
        }
        {
          // The completion events' topic; the app publishes with its identity (EventGrid Data Sender).
          name: 'TILECOMMIT_EVENTS_ENDPOINT'
          value: completionEvents.outputs.endpoint
        }
        {
          name: 'TILECOMMIT_TILE_RETENTION_DAYS'
          value: string(tileRetentionDays)
        }
        {
          name: 'TILECOMMIT_PROFILE'
          value: outputProfile
        }
        {
          name: 'TILECOMMIT_PROFILE_RULES'
          value: profileRules
        }
        {
          name: 'TILECOMMIT_COLLECTION'
          value: collectionId
        }
        {
          name: 'TILECOMMIT_COLLECTION_RULES'
          value: collectionRules
        }
        {
          // Each job's compute estimate: the instance's memory (Consumption's instances have 1.5 GB).
          name: 'TILECOMMIT_INSTANCE_MEMORY_MB'
          value: string(isFlex ? instanceMemoryMB : 1536)
        }
        // GDAL limits that keep the mosaic assembly near 300 MB however large the scene (docs/design.md,
        // 'GDAL settings and raster figures'), and /vsiaz/ reads that neither list the container nor give up on one slow request.
        {
          name: 'GDAL_CACHEMAX'
          value: string(gdalCacheMaxMb)
        }
        {
          name: 'GDAL_MAX_DATASET_POOL_SIZE'
          value: '20'
        }
        {
          name: 'GDAL_SWATH_SIZE'
          value: '16777216'
        }
        {
          name: 'GDAL_OVR_CHUNK_MAX_SIZE'
          value: '4194304'
        }
        {
          name: 'GDAL_DISABLE_READDIR_ON_OPEN'
          value: 'EMPTY_DIR'
        }
        {
          name: 'GDAL_HTTP_MAX_RETRY'
          value: '5'
        }
        {
          name: 'GDAL_HTTP_RETRY_DELAY'
          value: '2'
        }
      ], catalogEnabled ? [
        // catalogEnabled only (tilecommit/settings.py CATALOG_SETTINGS): each finished job is published
        // to pgstac as the data identity, whose role (named after it, catalog-migrate.sh) holds
        // pgstac_ingest; the password is an Entra token of that identity (AZURE_CLIENT_ID).
        {
          name: 'TILECOMMIT_PGSTAC_HOST'
          value: catalogEnabled ? postgres.outputs.fqdn : ''
        }
        {
          name: 'TILECOMMIT_PGSTAC_PORT'
          value: string(catalogPort)
        }
        {
          name: 'TILECOMMIT_PGSTAC_DATABASE'
          value: catalogDatabaseName
        }
        {
          name: 'TILECOMMIT_PGSTAC_USER'
          value: dataIdentity.name
        }
        {
          name: 'TILECOMMIT_PGSTAC_AUTH'
          value: 'entra'
        }
        {
          name: 'TILECOMMIT_STAC_API_URL'
          value: catalogEnabled ? stacApi.outputs.url : ''
        }
      ] : [], useScheduler ? [
        // durableBackend DurableTaskScheduler only. Each AzureFunctionsJobHost__<path> setting
        // overrides host.json's value at that path (the Functions host reads app settings over
        // host.json), so host.json stays the Azure Storage provider's; the storageProvider section is
        // a dictionary each provider reads its own keys from (ext Options/DurableTaskOptions.cs,
        // StorageProvider), so partitionCount there is ignored by azureManaged.
        {
          name: 'AzureFunctionsJobHost__extensions__durableTask__storageProvider__type'
          value: 'azureManaged'
        }
        {
          name: 'AzureFunctionsJobHost__extensions__durableTask__storageProvider__connectionStringName'
          value: schedulerConnectionSetting
        }
        {
          // Not a secret: an endpoint and the host identity's client id; the scheduler takes
          // Entra ID only.
          name: schedulerConnectionSetting
          value: 'Endpoint=${useScheduler ? durableTaskScheduler.outputs.endpoint : ''};Authentication=ManagedIdentity;ClientID=${identity.properties.clientId}'
        }
      ] : [], isFlex ? [] : [
        // Consumption (Y1, Linux) only; on Flex Consumption these are replaced by functionAppConfig.
        // Without Azure Files and without keys, Linux Consumption runs the code from a package URL,
        // downloaded with the user-assigned identity.
        {
          name: 'FUNCTIONS_EXTENSION_VERSION'
          value: '~4'
        }
        {
          name: 'FUNCTIONS_WORKER_RUNTIME'
          value: 'python'
        }
        {
          name: 'WEBSITE_RUN_FROM_PACKAGE'
          value: '${storage.outputs.blobEndpoint}${packageContainerName}/${packageBlobName}'
        }
        {
          name: 'WEBSITE_RUN_FROM_PACKAGE_BLOB_MI_RESOURCE_ID'
          value: identity.id
        }
      ])
    }
  }
  dependsOn: [
    // The host should find its storage roles, and with vnetEnabled its private endpoints, in place
    // when it first starts.
    storageRoles
    storagePrivateEndpoints
    durableTaskScheduler
  ]
}

// No FTP or Kudu basic-auth (publishing profile) credentials: deploy.sh deploys with Entra ID.
resource ftpBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'ftp'
  properties: {
    allow: false
  }
}

resource scmBasicAuth 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: functionApp
  name: 'scm'
  properties: {
    allow: false
  }
}

// ---------------------------------------------------------------------------------------------
// Event Grid: blob created in the input container -> the blob trigger
// ---------------------------------------------------------------------------------------------

module events 'modules/events.bicep' = {
  name: 'events'
  params: {
    name: systemTopicName
    storageAccountId: storage.outputs.id
    location: location
    tags: resourceTags
  }
}

module eventSubscription 'modules/event-subscription.bicep' = if (deployEventSubscription) {
  name: 'event-subscription'
  params: {
    name: eventSubscriptionName
    systemTopicName: events.outputs.name
    functionAppName: functionApp.name
    triggerFunctionName: triggerFunctionName
    inputContainerName: inputContainerName
    storageAccountId: storage.outputs.id
    deadLetterContainerName: deadLetterContainerName
  }
}

module completionEvents 'modules/completion-events.bicep' = {
  name: 'completion-events'
  params: {
    name: completionTopicName
    location: location
    tags: resourceTags
    publisherPrincipalId: dataIdentity.properties.principalId
    webhookUrl: completionWebhookUrl
  }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    systemTopicId: events.outputs.id
    applicationInsightsId: monitoring.outputs.applicationInsightsId
    actionGroupId: alertActionGroupId
    location: location
    tags: resourceTags
  }
}

// ---------------------------------------------------------------------------------------------
// Outputs: read by infra/deploy.sh, and kept by azd in its environment under these same names,
// where infra/hooks/postdeploy.sh finds them.
// ---------------------------------------------------------------------------------------------

output functionAppName string = functionApp.name
output functionAppHostName string = functionApp.properties.defaultHostName
output hostingPlan string = hostingPlan
output pythonVersion string = appPythonVersion
output storageAccountName string = storage.outputs.name
output storageAccountId string = storage.outputs.id
output inputContainer string = inputContainerName
output tilesContainer string = tilesContainerName
output outputContainer string = outputContainerName
output packageContainer string = packageContainerName
output packageBlob string = packageBlobName
output manifestTable string = manifestTableName
output applicationInsightsName string = monitoring.outputs.applicationInsightsName
output logAnalyticsName string = monitoring.outputs.logAnalyticsName
output identityName string = identity.name
output systemTopicName string = events.outputs.name
output deadLetterContainer string = deadLetterContainerName
output completionTopicName string = completionEvents.outputs.name
output eventSubscriptionName string = eventSubscriptionName
output triggerFunctionName string = triggerFunctionName
output networkIsolated bool = networkIsolated
output durableBackend string = durableBackend
output durableTaskSchedulerName string = useScheduler ? durableTaskScheduler.outputs.name : ''
output durableTaskSchedulerEndpoint string = useScheduler ? durableTaskScheduler.outputs.endpoint : ''
// What infra/catalog-migrate.sh reads (empty without the catalog).
output catalogEnabled bool = catalogEnabled
output catalogServerName string = catalogEnabled ? postgres.outputs.name : ''
output catalogHost string = catalogEnabled ? postgres.outputs.fqdn : ''
output catalogDatabase string = catalogEnabled ? catalogDatabaseName : ''
output catalogIngestRole string = catalogEnabled ? dataIdentity.name : ''
output catalogReadRole string = catalogEnabled ? stacApi.outputs.identityName : ''
output stacApiUrl string = catalogEnabled ? stacApi.outputs.url : ''

// The outputs azd's Functions quickstarts declare, for azd and for whoever reads `azd env get-values`.
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output AZURE_FUNCTION_APP_NAME string = functionApp.name
output SERVICE_API_NAME string = functionApp.name
output SERVICE_API_URI string = 'https://${functionApp.properties.defaultHostName}'
