// Blob-created events of the input container -> the blob trigger's webhook (Event Grid source).
//
// The webhook needs the host's `blobs_extension` system key, which the Functions host creates when
// code with an Event Grid blob trigger starts. So this module runs in the second deployment
// (deployEventSubscription=true in main.bicep), after infra/deploy.sh has published the code.
// The key is read here with listKeys and goes straight into the subscription's endpoint URL, which
// Event Grid stores write-only: it is in no parameter, output or app setting.

param systemTopicName string

param functionAppName string

@description('The blob-triggered function (tilecommit/settings.py TRIGGER_FUNCTION).')
param triggerFunctionName string

@description('The container users upload rasters to (tilecommit/settings.py INPUT_CONTAINER).')
param inputContainerName string

@description('Name of the event subscription.')
param name string

@description('The storage account holding the dead-letter container.')
param storageAccountId string

@description('Where Event Grid writes the events it could not deliver (tilecommit/settings.py DEAD_LETTER_CONTAINER).')
param deadLetterContainerName string

resource systemTopic 'Microsoft.EventGrid/systemTopics@2022-06-15' existing = {
  name: systemTopicName
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource hostKeys 'Microsoft.Web/sites/host@2024-04-01' existing = {
  parent: functionApp
  name: 'default'
}

// defaultHostName rather than <app>.azurewebsites.net: new Flex Consumption apps may get a unique
// default host name with a random part and the region in it.
var webhookUrl = 'https://${functionApp.properties.defaultHostName}/runtime/webhooks/blobs?functionName=Host.Functions.${triggerFunctionName}&code=${hostKeys.listKeys().systemKeys.blobs_extension}'

resource subscription 'Microsoft.EventGrid/systemTopics/eventSubscriptions@2022-06-15' = {
  parent: systemTopic
  name: name
  properties: {
    destination: {
      endpointType: 'WebHook'
      properties: {
        endpointUrl: webhookUrl
        // One event a request: the blob extension starts one function run per event anyway.
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    filter: {
      includedEventTypes: [
        'Microsoft.Storage.BlobCreated'
      ]
      // Only the input container; the app's own writes to the tiles and output containers must
      // not start jobs.
      subjectBeginsWith: '/blobServices/default/containers/${inputContainerName}/'
      // A zero-byte create (e.g. an SFTP or Data Lake client creating the file before writing
      // it) is not a raster yet: the event for the real commit follows.
      advancedFilters: [
        {
          operatorType: 'NumberGreaterThan'
          key: 'data.contentLength'
          value: 0
        }
      ]
    }
    eventDeliverySchema: 'EventGridSchema'
    // Event Grid's defaults, spelled out: retries with back-off (10 s, 30 s, 1 min, 5 min, ... up
    // to every 12 h) for 24 hours or 30 attempts, whichever ends first, while the app is
    // cold-starting or failing. Delivery is at least once; the app's job id makes it harmless.
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
    // An event still undelivered then (or refused with 400, 401, 403 or 413, which Event Grid does
    // not retry) is written to this container instead of being dropped, by the topic's own
    // identity (events.bicep; its role: storage-roles.bicep). `python -m devhost replay-dead-letters`
    // delivers them again; each becomes a job or a duplicate (docs/operations.md).
    deadLetterWithResourceIdentity: {
      identity: {
        type: 'SystemAssigned'
      }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storageAccountId
          blobContainerName: deadLetterContainerName
        }
      }
    }
  }
}

output name string = subscription.name
