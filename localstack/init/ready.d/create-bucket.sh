#!/usr/bin/env bash
# LocalStack init hook (ready stage): create the bucket lakeshore's examples use.
# Idempotent, so restarting the container with a persisted state does no harm.
set -euo pipefail

bucket="lakeshore"

if awslocal s3api head-bucket --bucket "$bucket" >/dev/null 2>&1; then
  echo "lakeshore: bucket s3://$bucket already exists"
else
  awslocal s3api create-bucket --bucket "$bucket"
  echo "lakeshore: created bucket s3://$bucket"
fi
