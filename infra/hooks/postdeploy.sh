#!/usr/bin/env bash
# azd's postdeploy hook (azure.yaml): once azd has published the code, subscribe the blob trigger to
# the input container's blob-created events. It is step 3 of infra/deploy.sh, run alone: the same
# code for both ways of deploying. azd gives its hooks its environment: AZURE_RESOURCE_GROUP and
# every output of infra/main.bicep under the output's own name, which --subscribe-only reads.
# TILECOMMIT_DRY_RUN=1 prints the az commands instead of running them.
set -euo pipefail

if [[ -z "${AZURE_RESOURCE_GROUP:-}" ]]; then
  printf 'error: AZURE_RESOURCE_GROUP is not set: run this from azd (azd up / azd deploy) after azd provision\n' >&2
  exit 1
fi
exec "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy.sh" --subscribe-only --resource-group "${AZURE_RESOURCE_GROUP}"
