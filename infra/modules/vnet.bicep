// The virtual network of vnetEnabled (main.bicep): one subnet the Flex Consumption app integrates
// with for its outbound traffic, one for the storage account's private endpoints
// (storage-private-endpoints.bicep). The layout is the one of Microsoft's Flex Consumption Durable
// Functions quickstart (Azure-Samples/durable-functions-quickstart-python-azd, infra/app/vnet.bicep),
// written out as plain resources so that checkov and the tests read every property.

param name string

param location string

param tags object = {}

@description('Address space of the network. Change it when the network is to be peered with one that uses 10.0.0.0/16.')
param addressPrefix string = '10.0.0.0/16'

@description('Subnet of the storage account\'s private endpoints.')
param privateEndpointSubnetPrefix string = '10.0.1.0/24'

@description('Subnet the function app integrates with. Flex Consumption wants it delegated to Microsoft.App/environments and used by no other app.')
param appSubnetPrefix string = '10.0.2.0/24'

@description('Subnet of the STAC API\'s Container Apps environment (main.bicep catalogEnabled), which reaches the database\'s private endpoint from it; a workload-profiles environment takes a /27 or larger, delegated to it alone.')
param stacApiSubnetPrefix string = '10.0.3.0/27'

var privateEndpointSubnetName = 'private-endpoints'
var appSubnetName = 'app'
var stacApiSubnetName = 'stac-api'

resource virtualNetwork 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    addressSpace: {
      addressPrefixes: [
        addressPrefix
      ]
    }
    subnets: [
      {
        name: privateEndpointSubnetName
        properties: {
          addressPrefix: privateEndpointSubnetPrefix
          // Private endpoints ignore network policies unless this is Enabled; none are set here.
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
        }
      }
      {
        name: appSubnetName
        properties: {
          addressPrefix: appSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
          // Flex Consumption's VNet integration runs in a subnet delegated to this service.
          delegations: [
            {
              name: 'flex-consumption'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
      {
        // Used only when the catalog is deployed; an empty delegated subnet costs nothing.
        name: stacApiSubnetName
        properties: {
          addressPrefix: stacApiSubnetPrefix
          privateEndpointNetworkPolicies: 'Disabled'
          privateLinkServiceNetworkPolicies: 'Enabled'
          delegations: [
            {
              name: 'container-apps'
              properties: {
                serviceName: 'Microsoft.App/environments'
              }
            }
          ]
        }
      }
    ]
  }
}

output id string = virtualNetwork.id
output name string = virtualNetwork.name
output appSubnetId string = '${virtualNetwork.id}/subnets/${appSubnetName}'
output privateEndpointSubnetId string = '${virtualNetwork.id}/subnets/${privateEndpointSubnetName}'
output stacApiSubnetId string = '${virtualNetwork.id}/subnets/${stacApiSubnetName}'
