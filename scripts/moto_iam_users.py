"""Gives a private moto server IAM users with the given policies, then turns
on moto's IAM enforcement, so every later request must be signed by one of
those users and is checked against its policy.

For tests that need each process to hold only its own AWS identity (the
broker worker against the credential sealer). moto checks actions and, for
KMS, only the resource `*`; it does not evaluate policy conditions, so the
caller passes policies with `*` resources and no conditions (and says so).

Usage: python3 scripts/moto_iam_users.py ENDPOINT < {"name": [statement, ...], ...}
Prints {"name": {"key": ..., "secret": ...}, ...}.
"""

import json
import sys
import boto3
import requests


def main() -> int:
    endpoint = sys.argv[1]
    users = json.load(sys.stdin)
    # Any identity works until enforcement is on.
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    keys = {}
    for name, statements in users.items():
        iam.create_user(UserName=name)
        if statements:
            iam.put_user_policy(
                UserName=name,
                PolicyName=f"{name}-policy",
                PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
            )
        key = iam.create_access_key(UserName=name)["AccessKey"]
        keys[name] = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}
    # From the next request on, every request is authenticated and authorised.
    answer = requests.post(f"{endpoint}/moto-api/reset-auth", data=b"0", timeout=10)
    answer.raise_for_status()
    json.dump(keys, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
