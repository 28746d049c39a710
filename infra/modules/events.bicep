// The Event Grid system topic of the storage account. Its subscription to the blob trigger is
// created by event-subscription.bicep once the code (and so the webhook key) exists. The topic's
// own (system-assigned) identity writes the events it cannot deliver to the dead-letter container:
// the account takes no keys, so dead-lettering must sign in like every other client.

param name string

@description('The storage account whose blob events the topic publishes.')
param storageAccountId string

@description('Must be the storage account\'s own region: a system topic lives with its source.')
param location string

param tags object = {}

resource systemTopic 'Microsoft.EventGrid/systemTopics@2022-06-15' = {
  name: name
  location: location
  tags: tags
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    source: storageAccountId
    topicType: 'Microsoft.Storage.StorageAccounts'
  }
}

output name string = systemTopic.name
output id string = systemTopic.id
output principalId string = systemTopic.identity.principalId
