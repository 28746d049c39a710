#!/usr/bin/env bash
# Deploy tilecommit to Azure: infrastructure (infra/main.bicep), code, Event Grid subscription.
# Safe to run again: every step converges to the same state. See docs/deployment.md.
# `azd up` deploys the same template and code, then runs step 3 of this script
# (infra/hooks/postdeploy.sh -> --subscribe-only); with the catalog, both run
# infra/catalog-migrate.sh once the template is deployed (azd: infra/hooks/postprovision.sh).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
readonly SCRIPT_DIR REPO_ROOT
readonly TEMPLATE="${SCRIPT_DIR}/main.bicep"
# Step 3 deploys the subscription alone: redeploying main.bicep would update the site (and may
# restart it) right before Event Grid's validation handshake with that same site.
readonly SUBSCRIPTION_TEMPLATE="${SCRIPT_DIR}/modules/event-subscription.bicep"
# Seconds to wait before each new try of the subscription (Event Grid validates the webhook when
# the subscription is created; a cold or restarting host can miss that handshake).
readonly SUBSCRIBE_BACKOFF=(30 60 120 240)
# Shared with azd, which fills its ${...} values; deploy() passes each of those itself.
readonly PARAMETERS="${SCRIPT_DIR}/main.parameters.json"
readonly DEPLOYMENT_NAME="tilecommit"
readonly MIN_AZ_VERSION="2.60.0"
# The Functions Python workers (3.11 on Consumption) run on x86-64 Linux (glibc >= 2.28).
readonly PACKAGE_PLATFORMS=(manylinux_2_28_x86_64 manylinux2014_x86_64)

# The outputs step 3 reads. With --subscribe-only they come from environment variables of the
# same names: azd keeps every output of main.bicep in its environment under the output's own name,
# and gives the environment to its hooks.
readonly SUBSCRIBE_OUTPUTS=(functionAppName functionAppHostName storageAccountName storageAccountId
  eventSubscriptionName systemTopicName triggerFunctionName inputContainer tilesContainer outputContainer
  deadLetterContainer manifestTable applicationInsightsName)

AZ="${AZ:-az}"
PYTHON="${PYTHON:-python3}"
# TILECOMMIT_DRY_RUN=1 (with --subscribe-only): print each az command, one line as a shell would
# read it, instead of running it; so the tests run the subscription step without Azure.
DRY_RUN="${TILECOMMIT_DRY_RUN:-0}"

usage() {
  cat <<'EOF'
Usage: infra/deploy.sh --resource-group NAME [options]
       infra/deploy.sh --package-only FILE.zip
       infra/deploy.sh --subscribe-only --resource-group NAME

Deploys tilecommit in three steps, each safe to repeat:
  1. az deployment group create: storage, identity, monitoring, function app, roles,
     Event Grid system topic (infra/main.bicep + infra/main.parameters.json);
  2. packages the code and publishes it:
     Flex Consumption: az functionapp deployment source config-zip (remote build of
                       requirements.txt on the platform);
     Consumption:      the package with its dependencies as Linux x86-64 wheels for
                       its Python (3.11), uploaded to the package container; restart;
  With --catalog, after step 1: pgstac's migration and the identities' database roles
     (infra/catalog-migrate.sh, as you: the server's Entra administrator);
  3. waits for the blob trigger's webhook key, then deploys the Event Grid subscription
     alone (infra/modules/event-subscription.bicep; what main.bicep deploys with
     deployEventSubscription=true), retried with backoff, without touching the app.

Options:
  -g, --resource-group NAME  resource group (created if it does not exist)
  -l, --location REGION      region for a new resource group (default: the group's own)
  -p, --plan PLAN            flex (Flex Consumption, default) or consumption (Y1, legacy)
      --python VERSION       the app's Python: 3.13 (Flex Consumption's default) or 3.11
                             (Consumption's, and the only one it takes)
  -n, --base-name NAME       prefix of resource names (default: tilecommit)
      --vnet                 network isolation (Flex Consumption only): a virtual network for the
                             app's outbound traffic, private endpoints for the storage account's
                             blob, queue and table, its public endpoint closed to all but trusted
                             Azure services (main.bicep vnetEnabled)
      --durable-backend B    where Durable keeps its task hub: storage (the storage account,
                             default) or scheduler (a Durable Task Scheduler and task hub;
                             main.bicep durableBackend)
      --catalog              the catalog (main.bicep catalogEnabled): PostgreSQL Flexible Server
                             with pgstac, you its Entra administrator, and the STAC API on
                             Azure Container Apps (docs/catalog.md, "Deploying the catalog")
      --infra-only           step 1 only (with --catalog, the migration too)
      --no-deployer-access   do not grant the signed-in principal upload/read roles on the
                             input and output containers (Consumption still needs the package one)
      --package-only FILE    only build the Consumption-plan package (code and Linux
                             wheels) into FILE; no Azure needed
      --subscribe-only       step 3 only, with the outputs of step 1 taken from environment
                             variables of the same names (azd's postdeploy hook runs this);
                             TILECOMMIT_DRY_RUN=1 prints its az commands instead of running them
  -h, --help                 this text

Prerequisites: Azure CLI >= 2.60 signed in (az login; az account set -s SUBSCRIPTION),
python3 with pip (builds the package), rights to create resources and role assignments
(Owner, or Contributor + Role Based Access Control Administrator) on the resource group.
Environment: AZ and PYTHON name other az / python executables.
EOF
}

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'error: %s\n\n' "$*" >&2; usage >&2; exit 2; }

resource_group=""
location=""
plan="flex"
python_version=""
base_name="tilecommit"
infra_only=false
deployer_access=true
package_only=""
vnet_enabled=false
durable="storage"
subscribe_only=false
catalog=false

while (($# > 0)); do
  case "$1" in
    -g | --resource-group) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; resource_group="$2"; shift 2 ;;
    -l | --location) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; location="$2"; shift 2 ;;
    -p | --plan) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; plan="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; python_version="$2"; shift 2 ;;
    -n | --base-name) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; base_name="$2"; shift 2 ;;
    --infra-only) infra_only=true; shift ;;
    --vnet) vnet_enabled=true; shift ;;
    --catalog) catalog=true; shift ;;
    --durable-backend) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; durable="$2"; shift 2 ;;
    --subscribe-only) subscribe_only=true; shift ;;
    --no-deployer-access) deployer_access=false; shift ;;
    --package-only) [[ $# -ge 2 ]] || usage_error "$1 needs a value"; package_only="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage_error "unknown argument: $1" ;;
  esac
done

case "${plan}" in
  flex) hosting_plan="FlexConsumption" ;;
  consumption) hosting_plan="Consumption" ;;
  *) usage_error "--plan must be flex or consumption, not '${plan}'" ;;
esac
case "${python_version}" in
  # --package-only builds the Consumption plan's package: its Python is 3.11.
  "") [[ "${hosting_plan}" == "FlexConsumption" && -z "${package_only}" ]] && python_version="3.13" || python_version="3.11" ;;
  3.11 | 3.13) ;;
  *) usage_error "--python must be 3.11 or 3.13, not '${python_version}'" ;;
esac
if [[ "${python_version}" == 3.13 && "${hosting_plan}" != "FlexConsumption" ]]; then
  # The template would deploy it; refuse here, as with --vnet: Linux Consumption stays on 3.11.
  usage_error "--python 3.13 needs --plan flex: the Consumption plan runs the app on Python 3.11"
fi
case "${durable}" in
  storage) durable_backend="AzureStorage" ;;
  scheduler) durable_backend="DurableTaskScheduler" ;;
  *) usage_error "--durable-backend must be storage or scheduler, not '${durable}'" ;;
esac
if [[ -z "${package_only}" && -z "${resource_group}" ]]; then
  usage_error "--resource-group is required"
fi
if [[ ! "${base_name}" =~ ^[a-z][a-z0-9-]{2,11}$ ]]; then
  usage_error "--base-name must be 3-12 lower-case letters, digits or hyphens, starting with a letter"
fi
if [[ "${vnet_enabled}" == true && "${hosting_plan}" != "FlexConsumption" ]]; then
  # The template ignores vnetEnabled on Consumption; refuse it here rather than deploy without it.
  usage_error "--vnet needs --plan flex: the Consumption plan has no VNet integration"
fi
if [[ "${DRY_RUN}" == 1 && "${subscribe_only}" != true ]]; then
  usage_error "TILECOMMIT_DRY_RUN=1 works with --subscribe-only only: the other steps need Azure's answers"
fi

workdir="$(mktemp -d)"
cleanup() { rm -rf "${workdir}"; }
trap cleanup EXIT

# ------------------------------------------------------------------------------------------------
# The code package: the app's files and, for Consumption, its dependencies as Linux wheels in
# .python_packages (Flex Consumption installs requirements.txt itself in a remote build).
# ------------------------------------------------------------------------------------------------

build_package() {
  local zip_path="$1" with_dependencies="$2" staging="${workdir}/package" platform_args=() p
  command -v "${PYTHON}" >/dev/null 2>&1 || die "${PYTHON} not found: python3 builds the code package"
  [[ -f "${REPO_ROOT}/function_app.py" && -f "${REPO_ROOT}/host.json" ]] \
    || die "function_app.py and host.json not found in ${REPO_ROOT}"

  rm -rf "${staging}"
  mkdir -p "${staging}"
  # Everything in the repository except what only development and deployment use: the names
  # below plus the patterns of .funcignore (matched against each file and folder name).
  "${PYTHON}" - "${REPO_ROOT}" "${staging}" <<'PY'
import fnmatch, shutil, sys
from pathlib import Path

root, staging = Path(sys.argv[1]), Path(sys.argv[2])
patterns = [
    ".git*", ".ci", ".venv*", ".pytest_cache", ".hypothesis", ".vscode", ".devhost",
    "node_modules", "tests", "bench", "devhost", "testkit", "docs", "infra", "demo-output", "local.settings*.json",
    "package.json", "package-lock.json", "Makefile", "pyproject.toml", "requirements-*.txt",
    "__pycache__", "*.pyc", "*.tif", "*.tiff", "__azurite*", "__*storage__", ".funcignore",
]
funcignore = root / ".funcignore"
if funcignore.is_file():
    for line in funcignore.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            patterns.append(line.strip("/"))

def ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)

def ignore(folder, names):
    return {name for name in names if ignored(name)}

for entry in sorted(root.iterdir()):
    if ignored(entry.name):
        continue
    if entry.is_dir():
        shutil.copytree(entry, staging / entry.name, ignore=ignore)
    else:
        shutil.copy2(entry, staging / entry.name)
PY
  if [[ "${with_dependencies}" == true ]]; then
    "${PYTHON}" -m pip --version >/dev/null 2>&1 || die "${PYTHON} has no pip: install pip (python3 -m ensurepip)"
    for p in "${PACKAGE_PLATFORMS[@]}"; do platform_args+=(--platform "${p}"); done
    # pip reads requirements.txt's markers (python_version < / >= "3.13") for the Python that runs
    # it, not for --python-version: that Python must be on the target's side of 3.13.
    "${PYTHON}" -c 'import sys; sys.exit((sys.version_info >= (3, 13)) != (sys.argv[1] >= "3.13"))' "${python_version}" \
      || die "${PYTHON} would read requirements.txt's markers for another Python than ${python_version}: set PYTHON to a Python ${python_version}"
    note "downloading Linux x86-64 wheels for Python ${python_version} (requirements.txt)"
    "${PYTHON}" -m pip install --quiet --disable-pip-version-check --no-compile \
      --target "${staging}/.python_packages/lib/site-packages" \
      --implementation cp --python-version "${python_version}" "${platform_args[@]}" --only-binary=:all: \
      -r "${REPO_ROOT}/requirements.txt" \
      || die "could not download the app's dependencies as Linux wheels (see pip's message above)"
  fi
  rm -f "${zip_path}"
  "${PYTHON}" - "${staging}" "${zip_path}" <<'PY'
import os, sys, zipfile

staging, zip_path = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
    for folder, dirs, files in os.walk(staging):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            archive.write(path, os.path.relpath(path, staging))
PY
}

if [[ -n "${package_only}" ]]; then
  say "Building the code package"
  build_package "${package_only}" true
  note "$(du -h "${package_only}" | cut -f1) ${package_only}"
  exit 0
fi

# Every az command goes through here, so that a dry run prints them all (on the original standard
# output, also from inside a command substitution) and runs none.
exec 3>&1
az_cli() {
  if [[ "${DRY_RUN}" == 1 ]]; then
    { printf 'az'; printf ' %q' "$@"; printf '\n'; } >&3
  else
    "${AZ}" "$@"
  fi
}

output() {
  if [[ "${subscribe_only}" == true ]]; then
    printf '%s\n' "${!1}"
  else
    az_cli deployment group show --resource-group "${resource_group}" --name "${DEPLOYMENT_NAME}" \
      --query "properties.outputs.${1}.value" --output tsv
  fi
}

# Step 1: the template with main.parameters.json, whose ${...} placeholders (azd fills them) each
# get a value here, after the file: the later --parameters win.
deploy() {
  local with_subscription="$1"
  az_cli deployment group create \
    --resource-group "${resource_group}" \
    --name "${DEPLOYMENT_NAME}" \
    --template-file "${TEMPLATE}" \
    --parameters "@${PARAMETERS}" \
    --parameters hostingPlan="${hosting_plan}" pythonVersion="${python_version}" baseName="${base_name}" \
    location="${deploy_location}" environmentName="" vnetEnabled="${vnet_enabled}" \
    durableBackend="${durable_backend}" \
    deployerPrincipalId="${deployer_id}" deployerPrincipalType="${deployer_type}" \
    grantDeployerDataAccess="${deployer_access}" \
    catalogEnabled="${catalog}" catalogAdministratorName="${deployer_name}" \
    deployEventSubscription="${with_subscription}" \
    --output none
}

if [[ "${subscribe_only}" == true ]]; then
  for name in "${SUBSCRIBE_OUTPUTS[@]}"; do
    [[ -n "${!name:-}" ]] \
      || die "--subscribe-only: no ${name} in the environment (azd sets it from main.bicep's outputs after azd provision)"
  done
fi

# ------------------------------------------------------------------------------------------------
# Prerequisites
# ------------------------------------------------------------------------------------------------

if [[ "${DRY_RUN}" != 1 ]]; then
  command -v "${AZ}" >/dev/null 2>&1 \
    || die "Azure CLI ('${AZ}') not found: install it (https://learn.microsoft.com/cli/azure/install-azure-cli), then az login"
  az_version="$(az_cli version --query '"azure-cli"' --output tsv 2>/dev/null || true)"
  if [[ -z "${az_version}" ]]; then
    die "could not run '${AZ} version': is the Azure CLI installed correctly?"
  fi
  if [[ "$(printf '%s\n%s\n' "${MIN_AZ_VERSION}" "${az_version}" | sort -V | head -n 1)" != "${MIN_AZ_VERSION}" ]]; then
    die "Azure CLI ${az_version} is too old: ${MIN_AZ_VERSION} or later is needed (az upgrade)"
  fi
  subscription="$(az_cli account show --query '[name, id]' --output tsv 2>/dev/null | paste -sd' ' || true)"
  if [[ -z "${subscription}" ]]; then
    die "not signed in to Azure: run 'az login' (and 'az account set --subscription NAME_OR_ID')"
  fi
  say "Subscription: ${subscription}"
fi

if [[ "${subscribe_only}" != true ]]; then
  namespaces=(Microsoft.Web Microsoft.Storage Microsoft.EventGrid Microsoft.Insights
    Microsoft.OperationalInsights Microsoft.ManagedIdentity)
  [[ "${catalog}" != true ]] || namespaces+=(Microsoft.DBforPostgreSQL Microsoft.App)
  for namespace in "${namespaces[@]}"; do
    state="$(az_cli provider show --namespace "${namespace}" --query registrationState --output tsv 2>/dev/null || true)"
    if [[ "${state}" != "Registered" ]]; then
      say "Registering resource provider ${namespace}"
      az_cli provider register --namespace "${namespace}" --wait --output none
    fi
  done

  # ------------------------------------------------------------------------------------------------
  # Resource group and deployer
  # ------------------------------------------------------------------------------------------------

  group_location="$(az_cli group show --name "${resource_group}" --query location --output tsv 2>/dev/null || true)"
  if [[ -n "${group_location}" ]]; then
    say "Resource group ${resource_group} exists (${group_location})"
    if [[ -n "${location}" && "${location}" != "${group_location}" ]]; then
      warn "--location ${location} ignored: the resources go to the group's region, ${group_location}"
    fi
  else
    [[ -n "${location}" ]] || die "resource group ${resource_group} does not exist: give --location to create it"
    say "Creating resource group ${resource_group} in ${location}"
    az_cli group create --name "${resource_group}" --location "${location}" --output none
  fi

  deployer_id=""
  deployer_type="User"
  # The catalog's server takes its Entra administrator by object id and name.
  deployer_name=""
  if [[ "${deployer_access}" == true || "${hosting_plan}" == "Consumption" || "${catalog}" == true ]]; then
    user_type="$(az_cli account show --query user.type --output tsv)"
    if [[ "${user_type}" == "user" ]]; then
      deployer_id="$(az_cli ad signed-in-user show --query id --output tsv 2>/dev/null || true)"
      deployer_name="$(az_cli ad signed-in-user show --query userPrincipalName --output tsv 2>/dev/null || true)"
    else
      deployer_type="ServicePrincipal"
      app_id="$(az_cli account show --query user.name --output tsv)"
      deployer_id="$(az_cli ad sp show --id "${app_id}" --query id --output tsv 2>/dev/null || true)"
      deployer_name="$(az_cli ad sp show --id "${app_id}" --query displayName --output tsv 2>/dev/null || true)"
    fi
    if [[ "${catalog}" == true && ( -z "${deployer_id}" || -z "${deployer_name}" ) ]]; then
      die "--catalog: could not look up your object id and name in Entra ID; the server's Entra administrator is you"
    fi
    if [[ -z "${deployer_id}" ]]; then
      [[ "${hosting_plan}" != "Consumption" ]] \
        || die "could not look up your object id in Entra ID; the Consumption plan needs it to upload the code"
      warn "could not look up your object id in Entra ID: no data roles granted to you"
    fi
  fi

  # The resources go to the group's region (main.bicep's own default); environmentName="" in
  # deploy(): no azd environment, so no azd-env-name tag.
  deploy_location="${group_location:-${location}}"

  # ------------------------------------------------------------------------------------------------
  # 1. Infrastructure
  # ------------------------------------------------------------------------------------------------

  say "1/3 Deploying infrastructure (${hosting_plan}) with ${TEMPLATE#"${REPO_ROOT}/"}"
  deploy false
  app_name="$(output functionAppName)"
  storage_account="$(output storageAccountName)"
  note "function app ${app_name}, storage account ${storage_account}"
  if [[ "${catalog}" == true ]]; then
    say "Catalog: pgstac's migration and the identities' roles (infra/catalog-migrate.sh)"
    "${SCRIPT_DIR}/catalog-migrate.sh" --resource-group "${resource_group}" --from-deployment
    note "STAC API: $(output stacApiUrl)"
  fi

  if [[ "${infra_only}" == true ]]; then
    say "Done (--infra-only): run again without it to publish the code and subscribe the trigger"
    exit 0
  fi

  # ------------------------------------------------------------------------------------------------
  # 2. Code
  # ------------------------------------------------------------------------------------------------

  say "2/3 Building and publishing the code"
  package="${workdir}/tilecommit.zip"
  if [[ "${hosting_plan}" == "FlexConsumption" ]]; then
    # Flex Consumption: the CLI posts the package to the app's deployment endpoint with your Entra
    # token; the platform installs requirements.txt for its own Linux image (remote build), keeps
    # the result in the deployment container (read with the app's identity) and restarts the app.
    build_package "${package}" false
    note "package: $(du -h "${package}" | cut -f1)"
    az_cli functionapp deployment source config-zip --resource-group "${resource_group}" \
      --name "${app_name}" --src "${package}" --build-remote true --output none
    note "published with az functionapp deployment source config-zip (remote build)"
  else
    build_package "${package}" true
    note "package: $(du -h "${package}" | cut -f1)"
    # Consumption (Linux): the app runs the package from its URL (WEBSITE_RUN_FROM_PACKAGE), read
    # with its identity. A new role assignment can take minutes to apply, hence the retries.
    container="$(output packageContainer)"
    blob="$(output packageBlob)"
    uploaded=false
    for attempt in $(seq 1 20); do
      if az_cli storage blob upload --auth-mode login --account-name "${storage_account}" \
        --container-name "${container}" --name "${blob}" --file "${package}" --overwrite \
        --only-show-errors --output none; then
        uploaded=true
        break
      fi
      note "upload refused (attempt ${attempt}/20; role assignments may still be propagating), retrying in 15 s"
      sleep 15
    done
    [[ "${uploaded}" == true ]] || die "could not upload the package to ${storage_account}/${container}"
    app_id="$(az_cli functionapp show --resource-group "${resource_group}" --name "${app_name}" --query id --output tsv)"
    az_cli functionapp restart --resource-group "${resource_group}" --name "${app_name}" --output none
    az_cli rest --method post --url "${app_id}/syncfunctiontriggers?api-version=2023-12-01" --output none
    note "uploaded ${container}/${blob}, restarted the app and synced its triggers"
  fi

fi

# ------------------------------------------------------------------------------------------------
# 3. Event Grid subscription
# ------------------------------------------------------------------------------------------------

if [[ "${subscribe_only}" == true ]]; then
  app_name="$(output functionAppName)"
  storage_account="$(output storageAccountName)"
fi

say "3/3 Subscribing the blob trigger to blob-created events"
note "waiting for the host to create the blob extension's webhook key (up to 10 minutes)"
key_ready=false
for attempt in $(seq 1 40); do
  # Asks only whether the key exists: the key itself is never printed or stored here. In
  # JMESPath the null literal is `null` in backticks (a bare null is a field named "null").
  # shellcheck disable=SC2016  # the backticks are JMESPath's, not a command substitution
  has_key="$(az_cli functionapp keys list --resource-group "${resource_group}" --name "${app_name}" \
    --query 'systemKeys.blobs_extension != `null`' --output tsv 2>/dev/null || true)"
  # A dry run cannot ask: it goes on as if the key existed.
  if [[ "${has_key}" == "true" || "${DRY_RUN}" == 1 ]]; then
    key_ready=true
    break
  fi
  sleep 15
done
if [[ "${key_ready}" != true ]]; then
  die "no blobs_extension key after 10 minutes: check the app's logs (Application Insights) and run this script again"
fi
subscribe() {
  az_cli deployment group create \
    --resource-group "${resource_group}" \
    --name "${DEPLOYMENT_NAME}-event-subscription" \
    --template-file "${SUBSCRIPTION_TEMPLATE}" \
    --parameters name="$(output eventSubscriptionName)" systemTopicName="$(output systemTopicName)" \
    functionAppName="${app_name}" triggerFunctionName="$(output triggerFunctionName)" \
    inputContainerName="$(output inputContainer)" \
    storageAccountId="$(output storageAccountId)" deadLetterContainerName="$(output deadLetterContainer)" \
    --output none
}
subscribed=false
for delay in "${SUBSCRIBE_BACKOFF[@]}" 0; do
  if subscribe; then
    subscribed=true
    break
  fi
  [[ "${delay}" -gt 0 ]] || break
  warn "subscription deployment failed (the host may have missed Event Grid's handshake); retrying in ${delay} s"
  sleep "${delay}"
done
[[ "${subscribed}" == true ]] \
  || die "could not create the Event Grid subscription: check the app's logs and run this script again"

say "Done"
note "function app:          ${app_name} (https://$(output functionAppHostName))"
note "storage account:       ${storage_account}"
note "containers:            $(output inputContainer) (uploads), $(output tilesContainer), $(output outputContainer)"
note "table:                 $(output manifestTable)"
note "application insights:  $(output applicationInsightsName)"
note "event subscription:    $(output eventSubscriptionName) on $(output systemTopicName)"
note "try it:  az storage blob upload --auth-mode login --account-name ${storage_account} \\"
note "           --container-name $(output inputContainer) --name scene.tif --file scene.tif"
