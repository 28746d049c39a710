#!/usr/bin/env bash
# The catalog's deploy step (main.bicep catalogEnabled): pgstac's migration on the server, then the
# app's data identity and the STAC API's identity mapped to pgstac's roles (infra/catalog_roles.py).
# Run by azd's postprovision hook (infra/hooks/postprovision.sh) and by infra/deploy.sh after its
# step 1; safe to repeat (pypgstac migrates only what is missing; roles and grants are made once).
#
# It signs in as you, the server's Microsoft Entra administrator: a token of yours for Azure
# Database for PostgreSQL (az account get-access-token --resource-type oss-rdbms) is the password,
# given to libpq in PGPASSWORD, never on a command line or printed. The server admits no address
# from outside Azure, so your address is let in by a firewall rule for the minutes of this step
# and the rule is deleted after it (TILECOMMIT_CLIENT_IP names the address; else it is asked of
# api.ipify.org). pypgstac, at the version requirements-dev.txt pins, is installed in a
# temporary virtual environment.
#
#   infra/catalog-migrate.sh --resource-group NAME
#
# The main.bicep outputs it reads come from environment variables of the same names (azd gives
# its hooks every output), or, with --from-deployment, from the deployment itself (deploy.sh).
# TILECOMMIT_DRY_RUN=1 prints the az commands and the SQL instead of running them.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
readonly SCRIPT_DIR REPO_ROOT
readonly DEPLOYMENT_NAME="tilecommit"
readonly FIREWALL_RULE="tilecommit-deployer-migration"
readonly CATALOG_OUTPUTS=(catalogServerName catalogHost catalogDatabase catalogIngestRole catalogReadRole)
AZ="${AZ:-az}"
PYTHON="${PYTHON:-python3}"
DRY_RUN="${TILECOMMIT_DRY_RUN:-0}"

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

resource_group=""
from_deployment=false
while (($# > 0)); do
  case "$1" in
    -g | --resource-group) [[ $# -ge 2 ]] || die "$1 needs a value"; resource_group="$2"; shift 2 ;;
    --from-deployment) from_deployment=true; shift ;;
    *) die "unknown argument: $1 (usage: infra/catalog-migrate.sh --resource-group NAME [--from-deployment])" ;;
  esac
done
[[ -n "${resource_group}" ]] || die "--resource-group is required"

exec 3>&1
az_cli() {
  if [[ "${DRY_RUN}" == 1 ]]; then
    { printf 'az'; printf ' %q' "$@"; printf '\n'; } >&3
  else
    "${AZ}" "$@"
  fi
}

output() {
  if [[ "${from_deployment}" == true ]]; then
    az_cli deployment group show --resource-group "${resource_group}" --name "${DEPLOYMENT_NAME}" \
      --query "properties.outputs.${1}.value" --output tsv
  else
    printf '%s\n' "${!1:-}"
  fi
}

enabled="$(output catalogEnabled)"
if [[ "${enabled,,}" != "true" ]]; then
  say "No catalog (catalogEnabled is not true): no migration"
  exit 0
fi
declare -A value
for name in "${CATALOG_OUTPUTS[@]}"; do
  value[${name}]="$(output "${name}")"
  [[ -n "${value[${name}]}" || "${DRY_RUN}" == 1 ]] || die "no ${name}: run this after the deployment of main.bicep"
done

pin="$(grep -E '^pypgstac==' "${REPO_ROOT}/requirements-dev.txt" || true)"
[[ -n "${pin}" ]] || die "requirements-dev.txt pins no pypgstac"

if [[ "${DRY_RUN}" == 1 ]]; then
  administrator="ADMINISTRATOR"
  client_ip="${TILECOMMIT_CLIENT_IP:-203.0.113.7}"
else
  administrator="$(az_cli ad signed-in-user show --query userPrincipalName --output tsv 2>/dev/null || true)"
  [[ -n "${administrator}" ]] || administrator="$(az_cli account show --query user.name --output tsv)"
  client_ip="${TILECOMMIT_CLIENT_IP:-$(curl -fsS https://api.ipify.org || true)}"
  [[ -n "${client_ip}" ]] || die "could not find your public address: set TILECOMMIT_CLIENT_IP"
fi

say "Catalog: pgstac on ${value[catalogHost]}, database ${value[catalogDatabase]}, as ${administrator}"
remove_rule() {
  az_cli postgres flexible-server firewall-rule delete --resource-group "${resource_group}" \
    --name "${value[catalogServerName]}" --rule-name "${FIREWALL_RULE}" --yes --output none || true
}
trap remove_rule EXIT
az_cli postgres flexible-server firewall-rule create --resource-group "${resource_group}" \
  --name "${value[catalogServerName]}" --rule-name "${FIREWALL_RULE}" \
  --start-ip-address "${client_ip}" --end-ip-address "${client_ip}" --output none
note "firewall: ${client_ip} admitted until this step ends"

if [[ "${DRY_RUN}" == 1 ]]; then
  printf 'pip install %s\n' "${pin}"
  printf 'pypgstac migrate\n'
  "${PYTHON}" "${SCRIPT_DIR}/catalog_roles.py" "${value[catalogDatabase]:-pgstac}" \
    "${value[catalogIngestRole]:-INGEST_ROLE}" "${value[catalogReadRole]:-READ_ROLE}" --dry-run
  exit 0
fi

workdir="$(mktemp -d)"
trap 'remove_rule; rm -rf "${workdir}"' EXIT
"${PYTHON}" -m venv "${workdir}/venv"
"${workdir}/venv/bin/pip" install --quiet --disable-pip-version-check "${pin/pypgstac==/pypgstac[psycopg]==}"
PGPASSWORD="$(az_cli account get-access-token --resource-type oss-rdbms --query accessToken --output tsv)"
export PGPASSWORD PGHOST="${value[catalogHost]}" PGPORT=5432 PGUSER="${administrator}" PGSSLMODE=require
export PGDATABASE="${value[catalogDatabase]}"
say "Migrating pgstac (${pin})"
"${workdir}/venv/bin/pypgstac" migrate
say "Mapping the identities to pgstac's roles"
"${workdir}/venv/bin/python" "${SCRIPT_DIR}/catalog_roles.py" "${value[catalogDatabase]}" \
  "${value[catalogIngestRole]}" "${value[catalogReadRole]}"
note "${value[catalogIngestRole]}: pgstac_ingest (the app publishes); ${value[catalogReadRole]}: pgstac_read (the STAC API)"
