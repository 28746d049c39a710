// Private endpoints of the storage account for vnetEnabled (main.bicep): one for each service the
// app uses (blob, queue, table; the app uses no Azure Files: Flex Consumption keeps its code in a
// blob container), each with its private DNS zone linked to the network, so that the account's usual
// host names (<account>.blob.core.windows.net ...) resolve to the endpoints' private addresses from
// inside the network. Layout of Azure-Samples/durable-functions-quickstart-python-azd,
// infra/app/storage-PrivateEndpoint.bicep, as plain resources.

param storageAccountName string

param virtualNetworkId string

param subnetId string

param location string

param tags object = {}

@description('The storage services the app calls: the host, Durable Functions and the code use blob, queue and table.')
param services array = [
  'blob'
  'queue'
  'table'
]

resource storageAccount 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

// privatelink.blob.core.windows.net and so on, in the public cloud (the suffix differs in others).
resource dnsZones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for service in services: {
  name: 'privatelink.${service}.${environment().suffixes.storage}'
  location: 'global'
  tags: tags
}]

// Without the link the network would go on resolving the public addresses, which refuse it.
resource dnsZoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (service, i) in services: {
  parent: dnsZones[i]
  name: '${storageAccountName}-${service}'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: virtualNetworkId
    }
  }
}]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2024-05-01' = [for service in services: {
  name: '${storageAccountName}-${service}-pe'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: subnetId
    }
    privateLinkServiceConnections: [
      {
        name: '${storageAccountName}-${service}'
        properties: {
          privateLinkServiceId: storageAccount.id
          groupIds: [
            service
          ]
        }
      }
    ]
  }
}]

// Writes the endpoint's A record into its zone, and keeps it there if the address changes.
resource dnsZoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = [for (service, i) in services: {
  parent: privateEndpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: service
        properties: {
          privateDnsZoneId: dnsZones[i].id
        }
      }
    ]
  }
}]

output privateEndpointIds array = [for (service, i) in services: privateEndpoints[i].id]
output dnsZoneNames array = [for (service, i) in services: dnsZones[i].name]
