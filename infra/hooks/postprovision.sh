#!/usr/bin/env bash
# azd's postprovision hook (azure.yaml): once azd has deployed infra/main.bicep, the catalog's
# migration and roles (catalogEnabled only; nothing otherwise). It is infra/catalog-migrate.sh,
# which infra/deploy.sh runs after its step 1: the same code for both ways of deploying. azd gives
# its hooks AZURE_RESOURCE_GROUP and every output of main.bicep under the output's own name.
set -euo pipefail

if [[ -z "${AZURE_RESOURCE_GROUP:-}" ]]; then
  printf 'error: AZURE_RESOURCE_GROUP is not set: run this from azd (azd up / azd provision)\n' >&2
  exit 1
fi
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/catalog-migrate.sh" --resource-group "${AZURE_RESOURCE_GROUP}"
