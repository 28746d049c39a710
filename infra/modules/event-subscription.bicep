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
    // Event Grid's defaults, spelled out: retries with back-off for 24 hours while the app is
    // cold-starting or failing. Delivery is at least once; the app's job id makes it harmless.
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
}

output name string = subscription.name
