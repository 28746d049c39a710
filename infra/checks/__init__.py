"""checkov custom checks for infra/ (loaded with --external-checks-dir infra/checks)."""
