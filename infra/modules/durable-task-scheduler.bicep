// The Durable Task Scheduler backend (main.bicep durableBackend = 'DurableTaskScheduler'): a
// scheduler, the app's one task hub in it, and the host's identity allowed on that task hub only.
// The Functions host's Durable extension is then the scheduler's client and worker (the app
// settings main.bicep adds with it switch host.json's storage provider to azureManaged); the
// code's identity gets nothing here, because the code never calls Durable itself: the starter,
// the job API and the retention sweep go through the host's Durable client binding.
//
// docs/deployment.md ("The Durable backend") says what changes with this backend and what does not;
// docs/local-host.md says what the local host models of it.

param name string

param location string

param tags object = {}

@description('The task hub: host.json\'s extensions.durableTask.hubName (tests/test_infra_agreement.py).')
param taskHubName string

@description('Consumption: billed per action, scales to zero like the app. Dedicated: capacity units bought ahead, for steady high throughput.')
@allowed([
  'Consumption'
  'Dedicated'
])
param skuName string = 'Consumption'

@description('Principal (object) id of the host\'s identity, which runs the orchestrations and activities.')
param hostPrincipalId string

// Durable Task Data Contributor: schedule, query, terminate and purge instances (the client's
// calls: the starter, the job API, the retention sweep) and take work items (the worker's). The
// narrower Durable Task Worker role covers the worker's calls only.
var durableTaskDataContributorRoleId = '0ad04412-c4d5-4796-b79c-f76d14c8d402'

resource scheduler 'Microsoft.DurableTask/schedulers@2025-11-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    // The scheduler takes Entra ID only (no keys, no connection secrets); its allow list must
    // name at least one range, an empty list refuses every caller. The app's outbound addresses
    // are not fixed (Flex Consumption without VNet integration), so every address may connect
    // and the role assignment below decides who is let in.
    ipAllowlist: [
      '0.0.0.0/0'
    ]
    sku: skuName == 'Dedicated' ? {
      name: 'Dedicated'
      capacity: 1
    } : {
      name: 'Consumption'
    }
  }
}

resource taskHub 'Microsoft.DurableTask/schedulers/taskHubs@2025-11-01' = {
  parent: scheduler
  name: taskHubName
}

resource hostOnTaskHub 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(taskHub.id, hostPrincipalId, durableTaskDataContributorRoleId)
  scope: taskHub
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', durableTaskDataContributorRoleId)
    principalId: hostPrincipalId
    principalType: 'ServicePrincipal'
    description: 'The Functions host runs the app\'s orchestrations and activities on this task hub.'
  }
}

output endpoint string = scheduler.properties.endpoint
output name string = scheduler.name
output taskHubName string = taskHub.name
