// The Event Grid custom topic the app publishes its completion events to (tilecommit/events.py:
// one CloudEvents 1.0 event, tilecommit.job.completed or tilecommit.job.failed, per job end).
// Entra ID only (no topic keys); the app's identity holds EventGrid Data Sender on this topic
// and on nothing else. A downstream system subscribes to it (a webhook here, or any Event Grid
// destination added later); the events' ids let a subscriber drop repeats.

param name string

param location string

param tags object = {}

@description('Principal (object) id of the app\'s identity, which publishes the events.')
param publisherPrincipalId string

@description('A webhook that receives every completion event (CloudEvents 1.0); empty: no subscription.')
@secure()
param webhookUrl string = ''

var eventGridDataSenderRoleId = 'd5a91429-5739-47e2-a06b-3470a27159e7'

resource topic 'Microsoft.EventGrid/topics@2022-06-15' = {
  name: name
  location: location
  tags: tags
  // For destinations that take Entra ID (Service Bus, Event Hubs, storage queues): a subscription
  // added later delivers with this identity and the role it is given there, no key needed.
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    inputSchema: 'CloudEventSchemaV1_0'
    // Publishing with a topic key is off: the app signs in with its identity.
    disableLocalAuth: true
    // Entra-only public endpoint, as the storage account's (infra/checkov-skips.toml, CKV_AZURE_193).
    publicNetworkAccess: 'Enabled'
  }
}

resource sender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topic.id, publisherPrincipalId, eventGridDataSenderRoleId)
  scope: topic
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', eventGridDataSenderRoleId)
    principalId: publisherPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The app publishes its jobs\' completion events.'
  }
}

resource webhook 'Microsoft.EventGrid/topics/eventSubscriptions@2022-06-15' = if (!empty(webhookUrl)) {
  parent: topic
  name: 'completion-webhook'
  properties: {
    destination: {
      endpointType: 'WebHook'
      properties: {
        endpointUrl: webhookUrl
        maxEventsPerBatch: 1
        preferredBatchSizeInKilobytes: 64
      }
    }
    eventDeliverySchema: 'CloudEventSchemaV1_0'
    filter: {
      includedEventTypes: [
        'tilecommit.job.completed'
        'tilecommit.job.failed'
      ]
    }
    retryPolicy: {
      maxDeliveryAttempts: 30
      eventTimeToLiveInMinutes: 1440
    }
  }
}

output endpoint string = topic.properties.endpoint
output name string = topic.name
