// The catalog's database (main.bicep catalogEnabled): Azure Database for PostgreSQL Flexible
// Server holding pgstac, which the app publishes each finished job's STAC item to and the STAC API
// (stac-api.bicep) reads. Microsoft Entra authentication only: no password exists, the app's data
// identity and the API's identity sign in with tokens, the deployer is the Entra administrator
// who runs pgstac's migration (infra/catalog-migrate.sh) and maps the identities to pgstac's roles.
//
// Networks: by default the public endpoint with Azure's "allow Azure services" rule (the Flex
// Consumption app has no fixed outbound address; every sign-in still needs an Entra token of a
// mapped role). With privateAccess (main.bicep vnetEnabled) a private endpoint in the app's network
// with its DNS zone, and no firewall rule at all: the public endpoint then admits nobody, except
// the deployer's address for the minutes catalog-migrate.sh adds it.

param name string

param location string

param tags object = {}

@description('Entra administrator: object id, name (user principal name, group or application display name) and type.')
param administratorObjectId string

param administratorName string

@allowed([
  'User'
  'Group'
  'ServicePrincipal'
])
param administratorType string = 'User'

@description('pgstac\'s database (tilecommit/settings.py DEFAULT_PGSTAC_DATABASE).')
param databaseName string = 'pgstac'

@description('The smallest that runs pgstac: Burstable B1ms (1 vCore, 2 GiB).')
param skuName string = 'Standard_B1ms'

@allowed([
  'Burstable'
  'GeneralPurpose'
  'MemoryOptimized'
])
param skuTier string = 'Burstable'

@description('Storage in GiB (32 is the smallest offered).')
param storageSizeGB int = 32

@description('A private endpoint in the app\'s network, no public firewall rule.')
param privateAccess bool = false

param virtualNetworkId string = ''

param privateEndpointSubnetId string = ''

// The extensions pgstac's migration creates (pypgstac's migrations/pgstac.<version>.sql: CREATE
// EXTENSION postgis, btree_gist, unaccent). Flexible Server creates only the extensions this
// server parameter allows.
var allowedExtensions = 'POSTGIS,BTREE_GIST,UNACCENT'

resource server 'Microsoft.DBforPostgreSQL/flexibleServers@2024-08-01' = {
  name: name
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuTier
  }
  properties: {
    version: '16'
    storage: {
      storageSizeGB: storageSizeGB
      autoGrow: 'Enabled'
    }
    backup: {
      backupRetentionDays: 7
      geoRedundantBackup: 'Disabled'
    }
    highAvailability: {
      mode: 'Disabled'
    }
    authConfig: {
      activeDirectoryAuth: 'Enabled'
      passwordAuth: 'Disabled'
      tenantId: tenant().tenantId
    }
    network: {
      // The private endpoint below; the public endpoint's firewall decides who else may connect.
      publicNetworkAccess: 'Enabled'
    }
  }
}

resource extensions 'Microsoft.DBforPostgreSQL/flexibleServers/configurations@2024-08-01' = {
  parent: server
  name: 'azure.extensions'
  properties: {
    value: allowedExtensions
    source: 'user-override'
  }
}

// The server takes one change at a time: each of these waits for the one before.
resource administrator 'Microsoft.DBforPostgreSQL/flexibleServers/administrators@2024-08-01' = {
  parent: server
  name: administratorObjectId
  properties: {
    principalName: administratorName
    principalType: administratorType
    tenantId: tenant().tenantId
  }
  dependsOn: [
    extensions
  ]
}

resource database 'Microsoft.DBforPostgreSQL/flexibleServers/databases@2024-08-01' = {
  parent: server
  name: databaseName
  properties: {
    charset: 'UTF8'
    collation: 'en_US.utf8'
  }
  dependsOn: [
    administrator
  ]
}

// 0.0.0.0 to 0.0.0.0 is Azure's "allow public access from any Azure service" rule.
resource azureServices 'Microsoft.DBforPostgreSQL/flexibleServers/firewallRules@2024-08-01' = if (!privateAccess) {
  parent: server
  name: 'AllowAllAzureServicesAndResourcesWithinAzureIps'
  properties: {
    startIpAddress: '0.0.0.0'
    endIpAddress: '0.0.0.0'
  }
  dependsOn: [
    database
  ]
}

// privatelink.postgres.database.azure.com in the public cloud.
resource dnsZone 'Microsoft.Network/privateDnsZones@2020-06-01' = if (privateAccess) {
  name: 'privatelink.postgres.database.azure.com'
  location: 'global'
  tags: tags
}

resource dnsZoneLink 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = if (privateAccess) {
  parent: dnsZone
  name: '${name}-link'
  location: 'global'
  tags: tags
  properties: {
    registrationEnabled: false
    virtualNetwork: {
      id: virtualNetworkId
    }
  }
}

resource privateEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = if (privateAccess) {
  name: '${name}-pe'
  location: location
  tags: tags
  properties: {
    subnet: {
      id: privateEndpointSubnetId
    }
    privateLinkServiceConnections: [
      {
        name: name
        properties: {
          privateLinkServiceId: server.id
          groupIds: [
            'postgresqlServer'
          ]
        }
      }
    ]
  }
}

resource dnsZoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = if (privateAccess) {
  parent: privateEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      {
        name: 'postgres'
        properties: {
          privateDnsZoneId: dnsZone.id
        }
      }
    ]
  }
}

output name string = server.name
output fqdn string = server.properties.fullyQualifiedDomainName
output databaseName string = database.name
output allowedExtensions string = allowedExtensions
