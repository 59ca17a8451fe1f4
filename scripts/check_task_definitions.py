#!/usr/bin/env python3
"""Checks the ECS task definitions and IAM policies in deploy/ against the code.

Runs offline with the standard library only. What the binary accepts is read
from the code at run time, never copied here:

- docs/configuration.md: every variable (name, default, meaning), which
  `leasehold/tests/it/docs.rs` checks against the typed settings in the code. A
  variable whose meaning says "never printed" is a secret (the code's
  `Setting::secret`): ECS must inject it from `secrets`.
- leasehold/src/main.rs: the subcommands (`enum Command`), for `command[0]`.
- deploy/roles.json: which policies each role carries. Which actions each
  role needs is the code's business: every subcommand declares its IAM actions
  (leasehold/src/iam.rs), every AWS call checks them, and the test beside that
  module compares them with these policies both ways.

The task definitions are also validated against the ECS API model in botocore
(the client-side validation `aws ecs register-task-definition --cli-input-json`
does), so a misspelt or mistyped field fails here, not at deploy time. botocore
comes with cfn-lint's dependencies; scripts/check_deploy.sh picks a Python that
has it.

    python3 scripts/check_task_definitions.py                # check deploy/
    python3 scripts/check_task_definitions.py --self-test    # each rule must catch a broken copy
    python3 scripts/check_task_definitions.py --iam-template # every policy in one CloudFormation
                                                             # template, for cfn-lint's IAM rules

Exit status 0 when everything holds, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
TASK_DEFINITIONS = DEPLOY / "task-definitions"
IAM = DEPLOY / "iam"

# Seconds a stream worker needs past DRAIN_TIMEOUT_MS before ECS may SIGKILL it:
# releasing up to MAX_STREAMS leases (one UpdateItem each) and flushing telemetry.
STOP_MARGIN_S = 5
FARGATE_MAX_STOP_TIMEOUT_S = 120

# Names fixed by the contract for components that are not in the binary yet.
# Accepted only while docs/configuration.md lacks them; a note says when to drop them.
PENDING_ENV = {
    "DASHBOARD_LISTEN": "arrives with `leasehold dashboard` (issue 6)",
    "DASHBOARD_TOKEN": "bearer token of the dashboard; arrives with issue 6",
}
PENDING_SECRETS = {"DASHBOARD_TOKEN"}
PENDING_SUBCOMMANDS = {"dashboard": "issue 6"}

# Placeholders the deploy files may use; deploy/README.md must explain each.
PLACEHOLDERS = {
    "ACCOUNT_ID", "REGION", "IMAGE", "TABLE", "CLUSTER", "BROKER_CLUSTER",
    "SUBNETS", "SECURITY_GROUPS", "UPSTREAM_URL_SECRET_ARN",
    "CREDENTIALS_KMS_KEY_ARN", "SINK_URL_SECRET_ARN", "DASHBOARD_TOKEN_SECRET_ARN",
    "REDIS_URL_BROKER_WORKER_SECRET_ARN", "REDIS_URL_POOL_MANAGER_SECRET_ARN",
    "REDIS_URL_MAINTENANCE_SECRET_ARN", "REDIS_URL_SIDECAR_SECRET_ARN",
    "REDIS_URL_DASHBOARD_SECRET_ARN", "REDIS_URL_CREDENTIAL_SEALER_SECRET_ARN",
    "CREDENTIALS_SEALER_HOST", "SEALER_TLS_CERT_SECRET_ARN", "SEALER_TLS_KEY_SECRET_ARN",
    "SEALER_TLS_CA_SECRET_ARN",
}

# Each subcommand connects to Redis as its own ACL user (deploy/redis-acl.conf):
# its REDIS_URL must be that role's secret, never another role's.
REDIS_URL_SECRET = {
    "broker-worker": "REDIS_URL_BROKER_WORKER_SECRET_ARN",
    "pool-manager": "REDIS_URL_POOL_MANAGER_SECRET_ARN",
    "maintenance": "REDIS_URL_MAINTENANCE_SECRET_ARN",
    "sidecar": "REDIS_URL_SIDECAR_SECRET_ARN",
    "dashboard": "REDIS_URL_DASHBOARD_SECRET_ARN",
    "credential-sealer": "REDIS_URL_CREDENTIAL_SEALER_SECRET_ARN",
}

# Stand-ins for the placeholders where a concrete value is needed (cfn-lint).
SAMPLES = {
    "ACCOUNT_ID": "123456789012", "REGION": "us-east-1",
    "IMAGE": "123456789012.dkr.ecr.us-east-1.amazonaws.com/leasehold:0.1.0",
    "TABLE": "websocket-leases", "CLUSTER": "leasehold", "BROKER_CLUSTER": "leasehold-broker",
    "SUBNETS": "subnet-0a1b2c3d", "SECURITY_GROUPS": "sg-0a1b2c3d",
    "CREDENTIALS_SEALER_HOST": "credential-sealer.leasehold.internal",
    "CREDENTIALS_KMS_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    **{name: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:leasehold/{name.lower()}-AbCdEf"
       for name in ("SINK_URL_SECRET_ARN", "UPSTREAM_URL_SECRET_ARN", "DASHBOARD_TOKEN_SECRET_ARN",
                    "SEALER_TLS_CERT_SECRET_ARN", "SEALER_TLS_KEY_SECRET_ARN",
                    "SEALER_TLS_CA_SECRET_ARN", *REDIS_URL_SECRET.values())},
}

# Which policies each role carries: deploy/roles.json, which the code's
# test (leasehold/src/iam/tests.rs) also reads to compare every role's policies
# with the IAM actions its subcommands declare, both ways. This script checks
# the policies' shape (resources, conditions, the KMS rules), not their actions.
ROLES = {role: entry["policies"] + entry.get("with_cloudwatch_api", [])
         for role, entry in json.loads((DEPLOY / "roles.json").read_text()).items()}
EXECUTION_ROLE = "leasehold-task-execution"
# Every broker worker task (and its sidecar) shares this role: it may allow no
# KMS action at all, and keeps an explicit Deny of kms:* so that a policy
# attached to it later cannot give it one.
BROKER_ROLE = "leasehold-broker-worker-task"
# The one decrypting component: its role allows exactly these actions.
SEALER_ROLE = "leasehold-credential-sealer-task"
SEALER_ACTIONS = {"kms:Decrypt"}
# The credentials key, the only KMS resource any policy may name.
KMS_KEY_RESOURCE = "${CREDENTIALS_KMS_KEY_ARN}"
# Redis users (deploy/redis-acl.conf) that may read / write credentials:* keys.
# Every other user, broker-worker above all, must reach none by any key pattern.
CREDENTIAL_READERS = {"admin", "api", "maintenance", "credential-sealer"}
SEALER_WRITES = {"pool:grant:*", "worker:active:*", "pool:holder:*", "pool:holders",
                 "pool:claims:processing:*"}
CREDENTIAL_WRITERS = {"admin", "api"}
# KMS actions that take an encryption context: each grant must require the
# user_id context to be present and to be the only context key.
KMS_CONTEXT_ACTIONS = {"kms:decrypt", "kms:encrypt", "kms:generatedatakey",
                       "kms:generatedatakeywithoutplaintext", "kms:reencryptfrom", "kms:reencryptto"}
KMS_CONTEXT_CONDITION = {
    "ForAllValues:StringEquals": {"kms:EncryptionContextKeys": ["user_id"]},
    "Null": {"kms:EncryptionContext:user_id": "false"},
}
OTHER_POLICIES = {
    "task-execution-policy.json",  # EXECUTION_ROLE
    "ecs-tasks-trust-policy.json",  # trust policy of every task role in ROLES
    "execution-role-trust-policy.json",  # trust policy of EXECUTION_ROLE
}
# Actions that accept no resource but "*" and have no condition worth adding.
STAR_ONLY_ACTIONS = {"ecr:GetAuthorizationToken"}
# Container-level secret-looking names and values (besides the variables whose
# meaning in docs/configuration.md says "never printed").
SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|SECRET", re.I)
# Names that match SECRET_NAME but hold no secret.
NOT_SECRET = {"CREDENTIALS_KMS_KEY_ID", "CREDENTIALS_ALLOW_LOCAL_KEY"}
# What opens credentials blobs: only the credential sealer's container gets any.
CREDENTIALS_KEY_VARS = {"CREDENTIALS_KMS_KEY_ID", "CREDENTIALS_KEY", "CREDENTIALS_KEY_FILE",
                        "CREDENTIALS_ALLOW_LOCAL_KEY"}
URL_WITH_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]+@")
AWS_ACCESS_KEY = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")
FARGATE_SIZES = {  # cpu units -> allowed task memory (MiB)
    256: {512, 1024, 2048},
    512: set(range(1024, 4097, 1024)),
    1024: set(range(2048, 8193, 1024)),
    2048: set(range(4096, 16385, 1024)),
    4096: set(range(8192, 30721, 1024)),
}


# --- what the code says ---------------------------------------------------------

def env_vars(configuration_md: str) -> dict[str, dict]:
    """name -> {default, doc} for every `| `NAME` | `default` | meaning |` row."""
    found = {}
    for line in configuration_md.splitlines():
        m = re.match(r"\|\s*`([A-Z][A-Z0-9_]*)`\s*\|\s*(.*?)\s*\|(.*)\|\s*$", line)
        if m:
            default = m.group(2)
            default = default[1:-1] if default.startswith("`") and default.endswith("`") else ""
            found[m.group(1)] = {"default": default, "doc": m.group(3)}
    return found


def subcommands(main_rs: str) -> set[str]:
    """`enum Command { StreamWorker(..), ... }` -> {"stream-worker", ...}."""
    m = re.search(r"enum Command \{(.*?)\n\}", main_rs, re.S)
    if not m:
        return set()
    names = re.findall(r"^\s+([A-Z]\w*)\s*[(,{]", m.group(1), re.M)
    return {re.sub(r"(?<!^)([A-Z])", r"-\1", n).lower() for n in names}


class Code:
    """Everything read from the repository's code."""

    def __init__(self, repo: Path = REPO):
        self.env = env_vars((repo / "docs/configuration.md").read_text())
        self.subcommands = subcommands((repo / "leasehold/src/main.rs").read_text())
        self.secrets = {n for n, v in self.env.items() if "never printed" in v["doc"]}
        # If the extraction breaks, fail loudly instead of checking against nothing.
        problems = []
        for name in ("LEASE_TABLE", "DRAIN_TIMEOUT_MS", "SIDECAR_LISTEN", "TELEMETRY_ADDR",
                     "REDIS_URL", "CREDENTIALS_KEY"):
            if name not in self.env:
                problems.append(f"docs/configuration.md: variable {name} not found (did the format change?)")
        if len(self.env) < 40:
            problems.append(f"docs/configuration.md: only {len(self.env)} variables found")
        for name in ("stream-worker", "sidecar", "broker-worker", "pool-manager", "maintenance"):
            if name not in self.subcommands:
                problems.append(f"leasehold/src/main.rs: subcommand {name} not found in enum Command")
        if "CREDENTIALS_KEY" not in self.secrets:
            problems.append("docs/configuration.md: CREDENTIALS_KEY's meaning no longer says 'never printed'")
        if problems:
            raise SystemExit("\n".join(problems))

    def default(self, name: str) -> str:
        return self.env.get(name, {}).get("default", "")


# --- checks -----------------------------------------------------------------------

def listen_port(addr: str) -> tuple[str, int | None]:
    host, _, port = addr.rpartition(":")
    return host, int(port) if port.isdigit() else None


def as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def check_task_definition(path: str, td: dict, code: Code, errors: list[str], notes: set[str]):
    def err(msg: str):
        errors.append(f"{path}: {msg}")

    for field in ("family", "taskRoleArn", "executionRoleArn", "containerDefinitions"):
        if not td.get(field):
            err(f"missing {field}")
    if td.get("networkMode") != "awsvpc":
        err(f"networkMode is {td.get('networkMode')!r}, Fargate needs 'awsvpc'")
    if "FARGATE" not in td.get("requiresCompatibilities", []):
        err("requiresCompatibilities must include FARGATE")
    cpu, memory = td.get("cpu"), td.get("memory")
    if not (isinstance(cpu, str) and cpu.isdigit() and isinstance(memory, str) and memory.isdigit()):
        err(f"cpu and memory must be strings of digits (got {cpu!r}, {memory!r})")
    elif int(memory) not in FARGATE_SIZES.get(int(cpu), set()):
        err(f"cpu {cpu} / memory {memory} is not a Fargate task size")
    role = str(td.get("taskRoleArn", "")).rpartition("/")[2]
    if role and role not in ROLES:
        err(f"taskRoleArn names role {role!r}, which scripts/check_task_definitions.py ROLES does not describe")
    if str(td.get("executionRoleArn", "")).rpartition("/")[2] != EXECUTION_ROLE:
        err(f"executionRoleArn must be the {EXECUTION_ROLE} role")

    containers = td.get("containerDefinitions") or []
    by_name = {c.get("name"): c for c in containers}
    sidecars = [c for c in containers if (c.get("command") or [None])[0] == "sidecar"]
    total_memory = 0
    for c in containers:
        name = c.get("name", "?")

        def cerr(msg: str, name=name):
            err(f"container {name!r}: {msg}")

        for field in ("name", "image", "command", "logConfiguration"):
            if not c.get(field):
                cerr(f"missing {field}")
        if not isinstance(c.get("essential"), bool):
            cerr("essential must be set explicitly (true or false)")
        command = c.get("command") or []
        sub = command[0] if command else None
        if sub and sub not in code.subcommands:
            if sub in PENDING_SUBCOMMANDS:
                notes.add(f"subcommand {sub!r} is not in the binary yet ({PENDING_SUBCOMMANDS[sub]})")
            else:
                cerr(f"command {sub!r} is not a leasehold subcommand ({', '.join(sorted(code.subcommands))})")
        log = c.get("logConfiguration") or {}
        options = log.get("options") or {}
        if log.get("logDriver") != "awslogs":
            cerr("logConfiguration.logDriver must be awslogs (EMF lines and logs go to CloudWatch Logs)")
        for option in ("awslogs-group", "awslogs-region", "awslogs-stream-prefix"):
            if not options.get(option):
                cerr(f"logConfiguration.options lacks {option}")
        total_memory += int(c.get("memory") or c.get("memoryReservation") or 0)

        # Environment: known names only, secrets never in plain text.
        env = {e.get("name"): e.get("value", "") for e in c.get("environment", [])}
        secrets = {s.get("name"): s.get("valueFrom", "") for s in c.get("secrets", [])}
        listed = [e.get("name") for e in c.get("environment", [])] + [s.get("name") for s in c.get("secrets", [])]
        for dup in sorted({n for n in listed if listed.count(n) > 1}):
            cerr(f"{dup} is set more than once")
        for var in listed:
            if var in code.env:
                continue
            if var in PENDING_ENV:
                notes.add(f"{var} is not in docs/configuration.md yet ({PENDING_ENV[var]})")
            else:
                cerr(f"{var} is not a variable the binary reads (docs/configuration.md)")
        for var, value in env.items():
            if var in code.secrets or var in PENDING_SECRETS:
                cerr(f"{var} is a secret (its doc says 'never printed'): move it to `secrets`")
            elif SECRET_NAME.search(var or "") and var not in NOT_SECRET:
                cerr(f"{var} looks like a secret: move it to `secrets`")
            if URL_WITH_PASSWORD.search(value) or AWS_ACCESS_KEY.search(value):
                cerr(f"{var}'s value holds a credential: move it to `secrets`")
        for var, value_from in secrets.items():
            if not re.fullmatch(r"\$\{\w+_SECRET_ARN\}|arn:aws[\w-]*:(secretsmanager|ssm):.+", value_from):
                cerr(f"secret {var}: valueFrom must be a Secrets Manager / SSM ARN (got {value_from!r})")
        own_url = REDIS_URL_SECRET.get(sub or "")
        if "REDIS_URL" in secrets and own_url and secrets["REDIS_URL"] != f"${{{own_url}}}":
            cerr(f"REDIS_URL must be ${{{own_url}}}: each role connects as its own Redis user")

        def effective(var: str, env=env) -> str:
            return env.get(var) or code.default(var)

        # Workers: start after the sidecar, get their drain before SIGKILL.
        if sub in ("stream-worker", "broker-worker"):
            if c.get("essential") is not True:
                cerr("a worker must be essential: the task exists to run it")
            if not sidecars:
                cerr("a worker needs a sidecar container (command ['sidecar']) in its task")
            deps = {d.get("containerName"): d.get("condition") for d in c.get("dependsOn", [])}
            for s in sidecars:
                if deps.get(s.get("name")) not in ("HEALTHY", "START"):
                    cerr(f"dependsOn must name {s.get('name')!r} with condition HEALTHY or START "
                         "(the worker starts after its sidecar and, reversed, stops before it)")
            stop = c.get("stopTimeout")
            if not isinstance(stop, int):
                cerr("stopTimeout must be set: it is the worker's drain budget after SIGTERM")
            else:
                if stop > FARGATE_MAX_STOP_TIMEOUT_S:
                    cerr(f"stopTimeout {stop} s exceeds Fargate's maximum of {FARGATE_MAX_STOP_TIMEOUT_S} s")
                if sub == "stream-worker":
                    drain_ms = effective("DRAIN_TIMEOUT_MS")
                    need = math.ceil(int(drain_ms) / 1000) + STOP_MARGIN_S if drain_ms.isdigit() else None
                    if need is None:
                        cerr(f"DRAIN_TIMEOUT_MS {drain_ms!r} is not a number")
                    elif stop < need:
                        cerr(f"stopTimeout {stop} s < DRAIN_TIMEOUT_MS {drain_ms} ms + {STOP_MARGIN_S} s "
                             "margin: ECS would SIGKILL the worker mid-drain")
            telemetry = effective("TELEMETRY_ADDR")
            for s in sidecars:
                s_env = {e.get("name"): e.get("value", "") for e in s.get("environment", [])}
                s_telemetry = s_env.get("TELEMETRY_ADDR") or code.default("TELEMETRY_ADDR")
                if s_telemetry != telemetry:
                    cerr(f"TELEMETRY_ADDR {telemetry} differs from its sidecar's {s_telemetry}")
            if not listen_port(telemetry)[0].startswith("127."):
                cerr(f"TELEMETRY_ADDR {telemetry} must stay on loopback")

        # Sidecar: health check on its own /healthz, metrics port published.
        if sub == "sidecar":
            host, port = listen_port(effective("SIDECAR_LISTEN"))
            if host.startswith("127.") or host == "localhost":
                cerr("SIDECAR_LISTEN is loopback: Prometheus could not scrape /metrics")
            check = " ".join(str(p) for p in (c.get("healthCheck") or {}).get("command", []))
            if not check:
                cerr("missing healthCheck (the worker's dependsOn and ECS rely on it)")
            elif "/healthz" not in check or str(port) not in check:
                cerr(f"healthCheck must request /healthz on the SIDECAR_LISTEN port {port}")
            ports = {p.get("containerPort") for p in c.get("portMappings", [])}
            if port not in ports:
                cerr(f"portMappings lacks containerPort {port} (SIDECAR_LISTEN, the /metrics port)")
            if listen_port(effective("TELEMETRY_ADDR"))[1] in ports:
                cerr("TELEMETRY_ADDR's port must not be published")

        # Broker worker: no key of any kind; its user's credentials come sealed
        # to its own key from the credential sealer (docs/configuration.md).
        if sub == "broker-worker":
            url = env.get("CREDENTIALS_SEALER_URL", "")
            if not re.fullmatch(r"https?://[^/:@\s]+:\d+/?", url):
                cerr(f"CREDENTIALS_SEALER_URL must be set to https://HOST:PORT of the credential sealer "
                     f"(got {url!r}): without it a worker on ECS would need a key to decrypt with")
            elif not url.startswith("https://"):
                cerr(f"CREDENTIALS_SEALER_URL must be https:// (got {url!r}): the sealer serves HTTPS only on ECS")
            if "CREDENTIALS_SEALER_CA" not in listed:
                cerr("CREDENTIALS_SEALER_CA must be set: the CA the worker trusts for the sealer")
            for var in sorted(CREDENTIALS_KEY_VARS & set(listed)):
                cerr(f"{var}: the broker worker holds no credentials key at all (only the credential "
                     "sealer decrypts)")
            if role != BROKER_ROLE:
                err(f"runs broker-worker, so its taskRoleArn must be the {BROKER_ROLE} role (the one the "
                    f"check keeps free of KMS), not {role!r}")

        # Credential sealer: KMS envelope blobs in production (a local key is
        # refused on ECS unless explicitly allowed), reachable by the broker
        # tasks, alone in its task: every container of a task holds its role.
        if sub == "credential-sealer":
            if not env.get("CREDENTIALS_KMS_KEY_ID"):
                cerr("CREDENTIALS_KMS_KEY_ID must be set (KMS envelope blobs in production)")
            local = {"CREDENTIALS_KEY", "CREDENTIALS_KEY_FILE"} & set(listed)
            if local and env.get("CREDENTIALS_ALLOW_LOCAL_KEY") != "true":
                cerr(f"{', '.join(sorted(local))}: a local key is refused on ECS unless "
                     "CREDENTIALS_ALLOW_LOCAL_KEY=true")
            if c.get("essential") is not True:
                cerr("the credential sealer must be essential: the task exists to run it")
            host, port = listen_port(effective("SEALER_LISTEN"))
            if host.startswith("127.") or host == "localhost":
                cerr("SEALER_LISTEN is loopback: broker workers in other tasks could not reach it")
            # HTTPS only on ECS (the binary refuses to start without it);
            # the health check and Prometheus use the plain-HTTP
            # SEALER_METRICS_LISTEN, which serves no seal.
            for tls in ("SEALER_TLS_CERT", "SEALER_TLS_KEY"):
                if tls not in secrets:
                    cerr(f"{tls} must come from `secrets`: the sealer serves HTTPS only on ECS")
            metrics = effective("SEALER_METRICS_LISTEN")
            if not metrics:
                cerr("SEALER_METRICS_LISTEN must be set: the ECS health check cannot speak TLS")
            else:
                _, metrics_port = listen_port(metrics)
                check = " ".join(str(p) for p in (c.get("healthCheck") or {}).get("command", []))
                if "/healthz" not in check or str(metrics_port) not in check:
                    cerr(f"healthCheck must request /healthz on the SEALER_METRICS_LISTEN port {metrics_port}")
                mapped = {p.get("containerPort") for p in c.get("portMappings", [])}
                if metrics_port not in mapped:
                    cerr(f"portMappings lacks containerPort {metrics_port} (SEALER_METRICS_LISTEN)")
                if (c.get("dockerLabels") or {}).get("ECS_PROMETHEUS_EXPORTER_PORT") != str(metrics_port):
                    cerr(f"dockerLabels.ECS_PROMETHEUS_EXPORTER_PORT must be {metrics_port} "
                         "(SEALER_METRICS_LISTEN: Prometheus scrapes plain HTTP)")
            if port not in {p.get("containerPort") for p in c.get("portMappings", [])}:
                cerr(f"portMappings lacks containerPort {port} (SEALER_LISTEN)")
            for other in containers:
                if other is not c:
                    err(f"container {other.get('name')!r} shares the credential sealer's task, hence its "
                        "role and kms:Decrypt (the task metadata endpoint serves the role to every "
                        "container): the sealer runs alone")
            if role != SEALER_ROLE:
                err(f"runs credential-sealer, so its taskRoleArn must be the {SEALER_ROLE} role")
        elif role == SEALER_ROLE:
            cerr(f"runs {sub!r} with the {SEALER_ROLE} role: only the credential sealer gets kms:Decrypt")

        if sub == "dashboard":
            listen = env.get("DASHBOARD_LISTEN")
            if not listen:
                cerr("DASHBOARD_LISTEN must be set explicitly (the default is loopback)")
            else:
                host, port = listen_port(listen)
                if host.startswith("127.") or host == "localhost":
                    cerr("DASHBOARD_LISTEN is loopback: the load balancer could not reach it")
                if port not in {p.get("containerPort") for p in c.get("portMappings", [])}:
                    cerr(f"portMappings lacks containerPort {port} (DASHBOARD_LISTEN)")
            if "DASHBOARD_TOKEN" not in secrets:
                cerr("DASHBOARD_TOKEN must come from `secrets`")

    if memory and memory.isdigit() and total_memory > int(memory):
        err(f"containers' memory ({total_memory} MiB) exceeds the task's {memory} MiB")
    for c in containers:
        for d in c.get("dependsOn", []):
            if d.get("containerName") not in by_name:
                err(f"container {c.get('name')!r} depends on unknown container {d.get('containerName')!r}")


def check_ecs_api_shape(path: str, td: dict, errors: list[str]):
    """What `aws ecs register-task-definition --cli-input-json` validates before sending."""
    try:
        import botocore.session
        from botocore.validate import ParamValidator
    except ImportError:
        errors.append("botocore is not importable: run through scripts/check_deploy.sh, which uses "
                      "the Python that has cfn-lint (botocore is one of its dependencies)")
        return
    operation = (botocore.session.get_session().get_service_model("ecs")
                 .operation_model("RegisterTaskDefinition"))
    report = ParamValidator().validate(td, operation.input_shape)
    if report.has_errors():
        for line in report.generate_report().splitlines():
            if line.strip() and not line.startswith("Parameter validation failed"):
                errors.append(f"{path}: ECS API: {line.strip()}")


def check_launchers(task_defs: dict[str, dict], code: Code, errors: list[str]):
    """The pool manager and maintenance must point at the broker worker's task
    definition and container, and agree with it and each other on the pool's names."""
    families = {td.get("family"): td for td in task_defs.values()}
    groups, ttls = {}, {}
    for path, td in task_defs.items():
        for c in td.get("containerDefinitions", []):
            env = {e.get("name"): e.get("value", "") for e in c.get("environment", [])}
            sub = (c.get("command") or [None])[0]
            if sub == "broker-worker" or "WORKER_MARK_TTL_SECONDS" in env:
                ttls[f"{path} ({c.get('name')})"] = env.get("WORKER_MARK_TTL_SECONDS") or code.default(
                    "WORKER_MARK_TTL_SECONDS")
            if env.get("TASK_LAUNCHER") != "ecs":
                continue
            groups[path] = env.get("POOL_GROUP") or code.default("POOL_GROUP")
            family = (env.get("ECS_TASK_DEFINITION") or "").rpartition("/")[2].partition(":")[0]
            container = env.get("ECS_CONTAINER_NAME") or code.default("ECS_CONTAINER_NAME")
            target = families.get(family)
            if target is None:
                errors.append(f"{path}: ECS_TASK_DEFINITION {family!r} is no task definition in deploy/")
                continue
            names = {t.get("name"): (t.get("command") or [None])[0] for t in target["containerDefinitions"]}
            if names.get(container) != "broker-worker":
                errors.append(f"{path}: ECS_CONTAINER_NAME {container!r} is not the container running "
                              f"broker-worker in {family} (USER_ID overrides would go nowhere)")
    if len(set(groups.values())) > 1:
        errors.append(f"POOL_GROUP differs between launchers: {groups} (maintenance would not see the pool)")
    for path, group in groups.items():
        if not 1 <= len(group) <= 36:
            errors.append(f"{path}: POOL_GROUP must be 1-36 characters (ECS startedBy)")
    if len(set(ttls.values())) > 1:
        errors.append(f"WORKER_MARK_TTL_SECONDS differs between the broker worker and maintenance: {ttls}")


def check_sealer_link(task_defs: dict[str, dict], code: Code, errors: list[str]):
    """Broker workers reach the sealer at the port it listens on."""
    sealer_ports, urls = {}, {}
    for path, td in task_defs.items():
        for c in td.get("containerDefinitions", []):
            env = {e.get("name"): e.get("value", "") for e in c.get("environment", [])}
            sub = (c.get("command") or [None])[0]
            if sub == "credential-sealer":
                sealer_ports[path] = listen_port(env.get("SEALER_LISTEN") or code.default("SEALER_LISTEN"))[1]
            if sub == "broker-worker" and env.get("CREDENTIALS_SEALER_URL"):
                urls[path] = env["CREDENTIALS_SEALER_URL"]
    if urls and not sealer_ports:
        errors.append("no task definition runs credential-sealer, which the broker workers' "
                      "CREDENTIALS_SEALER_URL points to")
    for path, url in urls.items():
        port = re.search(r":(\d+)/?$", url)
        for sealer, sealer_port in sealer_ports.items():
            if not port or int(port.group(1)) != sealer_port:
                errors.append(f"{path}: CREDENTIALS_SEALER_URL {url} differs from the sealer's SEALER_LISTEN "
                              f"port {sealer_port} ({sealer})")


def statements(policy: dict) -> list[dict]:
    return as_list(policy.get("Statement", []))


def glob_reaches(pattern: str, prefix: str, brackets: bool = False) -> bool:
    """Whether some string starting with `prefix` matches the glob `pattern`.

    `*` and `?` (IAM actions, and Redis), plus with `brackets` Redis's `[...]`
    classes (`^` negation, `a-z` ranges) and `\\` escapes. Exact, not a guess
    from a list of names: `~cred*`, `~c?edentials:*`, `~[c]redentials:x` and
    `~credentials:alice` all reach `credentials:`; `~credit:*` does not.
    """
    i, n = 0, len(pattern)
    for ch in prefix:
        if i >= n:
            return False
        p = pattern[i]
        if p == "*":
            return True
        if p == "?":
            i += 1
        elif brackets and p == "\\" and i + 1 < n:
            if pattern[i + 1] != ch:
                return False
            i += 2
        elif brackets and p == "[":
            j, negate, hit = i + 1, False, False
            if j < n and pattern[j] == "^":
                negate, j = True, j + 1
            while j < n and pattern[j] != "]":
                if pattern[j] == "\\" and j + 1 < n:
                    hit |= pattern[j + 1] == ch
                    j += 2
                elif j + 2 < n and pattern[j + 1] == "-":
                    low, high = sorted((pattern[j], pattern[j + 2]))
                    hit |= low <= ch <= high
                    j += 3
                else:
                    hit |= pattern[j] == ch
                    j += 1
            if hit == negate:
                return False
            i = j + 1
        elif p != ch:
            return False
        else:
            i += 1
    return True


def allows_any(statement: dict, service: str) -> list[str]:
    """The patterns by which an Allow statement allows some action of `service`
    (`kms:Decrypt`, `kms:*`, `*`, `k?s:De*` ..., or a NotAction that leaves one open)."""
    if statement.get("Effect") != "Allow":
        return []
    prefix = f"{service}:"
    reached = [a for a in as_list(statement.get("Action", []))
               if isinstance(a, str) and glob_reaches(a.lower(), prefix)]
    if "NotAction" in statement:
        # Allow + NotAction allows every action the list does not exclude: the
        # service stays open unless one entry covers all of it (`*`, `kms:*`, `k*`).
        excluded = as_list(statement["NotAction"])
        if not any(isinstance(a, str) and a.endswith("*") and "*" not in a[:-1] and "?" not in a
                   and prefix.startswith(a[:-1].lower()) for a in excluded):
            reached.append(f"NotAction {excluded}")
    return reached


def denies_all(statement: dict, service: str) -> bool:
    """An unconditional Deny of every action of `service` on every resource."""
    return (statement.get("Effect") == "Deny" and not statement.get("Condition")
            and "*" in as_list(statement.get("Resource", []))
            and any(a.lower() in ("*", f"{service}:*") for a in as_list(statement.get("Action", []))))


def check_policy(path: str, policy: dict, code: Code, errors: list[str]):
    def err(msg: str):
        errors.append(f"{path}: {msg}")

    if policy.get("Version") != "2012-10-17":
        err("Version must be 2012-10-17")
    if not statements(policy):
        err("no Statement")
    for i, st in enumerate(statements(policy)):
        where = f"statement {st.get('Sid') or i}"
        actions = [a for a in as_list(st.get("Action", [])) if a]
        if st.get("Effect") not in ("Allow", "Deny") or not actions:
            err(f"{where}: needs Effect and Action")
            continue
        if "Principal" in st:  # a trust policy
            continue
        resources = as_list(st.get("Resource", []))
        if not resources:
            err(f"{where}: needs Resource")
        if st["Effect"] != "Allow":
            continue
        for action in actions:
            if "*" in action:
                err(f"{where}: wildcard action {action!r}")
            if action == "dynamodb:CreateTable":
                err(f"{where}: CreateTable is for the operator (`leasehold table create` or "
                    "deploy/lease-table.yaml), never a task role")
        if any(a.lower().startswith("dynamodb:") for a in actions):
            for r in resources:
                if not re.fullmatch(r"arn:aws[\w-]*:dynamodb:[^:*]+:[^:*]+:table/[^/*]+"
                                    r"(/index/assignee-index)?", str(r)):
                    err(f"{where}: DynamoDB resource {r!r} must be the lease table's ARN (or its "
                        "assignee index's), no wildcard")
        if "*" in resources and not st.get("Condition") and not set(actions) <= STAR_ONLY_ACTIONS:
            err(f"{where}: Resource '*' needs a Condition that narrows it")
        if "iam:PassRole" in actions and "iam:PassedToService" not in json.dumps(st.get("Condition", {})):
            err(f"{where}: iam:PassRole needs an iam:PassedToService condition")
        if any(a.lower().startswith("kms:") for a in actions):
            if resources != [KMS_KEY_RESOURCE]:
                err(f"{where}: KMS resource must be {KMS_KEY_RESOURCE} only (got {resources})")
            condition = st.get("Condition") or {}
            for action in (a for a in actions if a.lower() in KMS_CONTEXT_ACTIONS):
                for operator, pairs in KMS_CONTEXT_CONDITION.items():
                    for key, value in pairs.items():
                        if (condition.get(operator) or {}).get(key) != value:
                            err(f"{where}: {action} without the encryption-context condition "
                                f"{operator} {key} = {value!r} (the user_id context must be present "
                                "and the only key)")


def check_roles(policies: dict[str, dict], errors: list[str]):
    used = set(OTHER_POLICIES)
    for role, files in ROLES.items():
        granted = set()
        for f in files:
            used.add(f)
            if f not in policies:
                errors.append(f"deploy/iam/{f}: missing (role {role} carries it)")
                continue
            for st in statements(policies[f]):
                if st.get("Effect") == "Allow":
                    granted |= set(as_list(st.get("Action", [])))
        if role == BROKER_ROLE:
            role_statements = [(f, st) for f in files if f in policies for st in statements(policies[f])]
            for f, st in role_statements:
                for how in allows_any(st, "kms"):
                    errors.append(f"role {role}: deploy/iam/{f} statement {st.get('Sid') or '?'} allows a KMS "
                                  f"action ({how}): a broker worker must hold no decrypt capability; "
                                  "only the credential sealer decrypts")
            if not any(denies_all(st, "kms") for _, st in role_statements):
                errors.append(f"role {role}: no unconditional Deny of kms:* on Resource '*' (it keeps any "
                              "policy attached to the role later from giving broker workers KMS)")
        if role == SEALER_ROLE:
            for action in sorted(granted - SEALER_ACTIONS):
                errors.append(f"role {role}: allows {action}; the credential sealer needs "
                              f"{', '.join(sorted(SEALER_ACTIONS))} only")
    for f in sorted(set(policies) - used):
        errors.append(f"deploy/iam/{f}: no role carries this policy (scripts/check_task_definitions.py ROLES)")


def check_placeholders(texts: dict[str, str], readme: str | None, errors: list[str]):
    for path, text in texts.items():
        for name in sorted(set(re.findall(r"\$\{(\w+)\}", text))):
            if name not in PLACEHOLDERS:
                errors.append(f"{path}: unknown placeholder ${{{name}}} (known: {', '.join(sorted(PLACEHOLDERS))})")
    if readme is not None:
        for name in sorted(PLACEHOLDERS):
            if f"${{{name}}}" not in readme:
                errors.append(f"deploy/README.md: placeholder ${{{name}}} is not explained")


def acl_users(acl: str) -> dict[str, list[str]]:
    """`user NAME rule rule ...` lines -> {NAME: [rule, ...]}; a `( ... )`
    selector stays one rule. Several lines for one user add up, as ACL SETUSER does."""
    users: dict[str, list[str]] = {}
    for line in acl.splitlines():
        if line.lstrip().startswith("#"):
            continue
        tokens = re.findall(r"\([^)]*\)|\S+", line)
        if len(tokens) >= 2 and tokens[0] == "user":
            users.setdefault(tokens[1], []).extend(tokens[2:])
    return users


def acl_key_patterns(rules: list[str]) -> list[tuple[str, str, str]]:
    """The key patterns a user ends up with: (permissions "R"/"W"/"RW", pattern, rule).

    Applied in order like Redis: `reset` / `resetkeys` drop the patterns before
    them (`resetkeys` inside a selector only that selector's), `clearselectors`
    the selectors; `allkeys` is `~*`; `~p` reads and writes; `%R~p`, `%W~p`,
    `%RW~p` as written; a selector `( ... )` adds its own patterns.
    """
    def flat(tokens: list[str]) -> list[tuple[str, str, str]]:
        found = []
        for rule in tokens:
            if rule in ("reset", "resetkeys"):
                found = []
            elif rule == "allkeys":
                found.append(("RW", "*", rule))
            elif rule.startswith("~"):
                found.append(("RW", rule[1:], rule))
            elif m := re.fullmatch(r"%([RWrw]+)~(.*)", rule):
                found.append(("".join(sorted(set(m.group(1).upper()))), m.group(2), rule))
        return found

    root: list[str] = []
    selectors: list[list[tuple[str, str, str]]] = []
    for rule in rules:
        if rule == "reset":
            root, selectors = [], []
        elif rule == "clearselectors":
            selectors = []
        elif rule.startswith("(") and rule.endswith(")"):
            selectors.append(flat(rule[1:-1].split()))
        else:
            root.append(rule)
    return flat(root) + [pattern for selector in selectors for pattern in selector]


def check_redis_acl(acl: str, errors: list[str]):
    """Only the credential sealer (and the API / maintenance, which hand blobs on)
    may read credentials:*; above all a broker worker, whose process the issue
    assumes compromised, reaches no credentials key by any pattern."""
    users = acl_users(acl)
    for needed in ("broker-worker", "credential-sealer"):
        if needed not in users:
            errors.append(f"deploy/redis-acl.conf: no `user {needed}` line")
    for name, rules in users.items():
        for perms, pattern, rule in acl_key_patterns(rules):
            if not glob_reaches(pattern, "credentials:", brackets=True):
                continue
            if "R" in perms and name not in CREDENTIAL_READERS:
                errors.append(f"deploy/redis-acl.conf: user {name} can read credentials:* keys ({rule!r}); "
                              f"only {', '.join(sorted(CREDENTIAL_READERS))} may")
            if "W" in perms and name not in CREDENTIAL_WRITERS:
                errors.append(f"deploy/redis-acl.conf: user {name} can write credentials:* keys ({rule!r}); "
                              f"only {', '.join(sorted(CREDENTIAL_WRITERS))} may")
    # The sealer writes only what its assign step and claim-user sweep touch
    # (the claim lists only because FCALL checks declared keys read-write).
    for perms, pattern, rule in acl_key_patterns(users.get("credential-sealer", [])):
        if "W" in perms and pattern not in SEALER_WRITES:
            errors.append(f"deploy/redis-acl.conf: user credential-sealer may write {rule!r}; "
                          f"it writes only {', '.join(sorted(SEALER_WRITES))}")
    # Only the credential sealer decides who holds a user: no broker-worker
    # user may write a user's mark (a pool mark is its own), nor the sealer's
    # holder records, nor list keys.
    for name in ("broker-worker",):
        for perms, pattern, rule in acl_key_patterns(users.get(name, [])):
            for sample in ("worker:active:alice", "pool:holder:alice", "pool:holders", "pool:grant:alice"):
                if "W" in perms and fnmatch.fnmatchcase(sample, pattern):
                    errors.append(f"deploy/redis-acl.conf: user {name} may write {sample} ({rule!r}); "
                                  "only the credential sealer assigns users")
        for command in ("+scan", "+keys", "+@keyspace", "+@all"):
            if command in users.get(name, []):
                errors.append(f"deploy/redis-acl.conf: user {name} has {command}: it may not list keys")


def check_lease_table(text: str, errors: list[str]):
    code_lines = [line.split("#", 1)[0] for line in text.splitlines()]
    if any("TimeToLiveSpecification" in line for line in code_lines):
        errors.append("deploy/lease-table.yaml: TTL must not be enabled (expiry is lease_expires_at in the "
                      "conditional write, never TTL)")
    for needed in ("PointInTimeRecoveryEnabled: true", "DeletionProtectionEnabled: true", "PAY_PER_REQUEST",
                   "AttributeName: stream_id", "IndexName: assignee-index", "ProjectionType: KEYS_ONLY"):
        if not any(needed in line for line in code_lines):
            errors.append(f"deploy/lease-table.yaml: expected {needed!r}")


# --- driver -----------------------------------------------------------------------

def load(directory: Path, errors: list[str]) -> dict[str, dict]:
    docs = {}
    for path in sorted(directory.glob("*.json")):
        rel = str(path.relative_to(REPO))
        try:
            docs[rel] = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            errors.append(f"{rel}: not valid JSON: {e}")
    return docs


def check_all(task_defs: dict[str, dict], policies: dict[str, dict], lease_table: str, acl: str,
              readme: str | None, code: Code) -> tuple[list[str], set[str]]:
    errors: list[str] = []
    notes: set[str] = set()
    if not task_defs:
        errors.append("deploy/task-definitions: no task definitions found")
    for path, td in task_defs.items():
        check_task_definition(path, td, code, errors, notes)
        check_ecs_api_shape(path, td, errors)
    check_launchers(task_defs, code, errors)
    check_sealer_link(task_defs, code, errors)
    for path, policy in policies.items():
        check_policy(path, policy, code, errors)
    check_roles({Path(p).name: d for p, d in policies.items()}, errors)
    texts = {p: json.dumps(d) for p, d in {**task_defs, **policies}.items()}
    check_placeholders(texts, readme, errors)
    check_lease_table(lease_table, errors)
    check_redis_acl(acl, errors)
    return errors, notes


def inputs():
    errors: list[str] = []
    task_defs = load(TASK_DEFINITIONS, errors)
    policies = load(IAM, errors)
    lease_table = (DEPLOY / "lease-table.yaml").read_text()
    acl = (DEPLOY / "redis-acl.conf").read_text()
    readme_path = DEPLOY / "README.md"
    readme = readme_path.read_text() if readme_path.exists() else None
    return errors, task_defs, policies, lease_table, acl, readme


def self_test(code: Code) -> int:
    """Breaks one thing at a time in a copy of the real files; each must be caught."""
    load_errors, task_defs, policies, lease_table, acl, readme = inputs()
    if load_errors:
        print("\n".join(load_errors))
        return 1
    stream = "deploy/task-definitions/stream-worker.json"
    broker = "deploy/task-definitions/broker-worker.json"
    observer = "deploy/iam/sidecar-observer-policy.json"
    broker_policy = "deploy/iam/broker-worker-task-policy.json"
    sealer = "deploy/task-definitions/credential-sealer.json"
    sealer_policy = "deploy/iam/credential-sealer-task-policy.json"
    # The broker worker's policy before the credential sealer: any user's context.
    unpinned_decrypt = {"Sid": "Unpinned", "Effect": "Allow", "Action": ["kms:Decrypt"],
                        "Resource": ["${CREDENTIALS_KMS_KEY_ARN}"]}

    def container(docs, path, name):
        return next(c for c in docs[path]["containerDefinitions"] if c["name"] == name)

    def unset(c, variable):
        c["environment"] = [e for e in c["environment"] if e["name"] != variable]

    # Most cases break one container of one task definition in one of a few
    # ways; each way is written once here and named in the table below.
    def set_fields(path, name, **fields):
        return lambda t, p: container(t, path, name).update(fields)

    def drop_field(path, name, field):
        return lambda t, p: container(t, path, name).pop(field)

    def set_env(path, name, variable, value):
        def breaks(t, p):
            c = container(t, path, name)
            unset(c, variable)
            c["environment"].append({"name": variable, "value": value})
        return breaks

    def drop_env(path, name, variable):
        return lambda t, p: unset(container(t, path, name), variable)

    def add_secret(path, name, variable, value_from):
        return lambda t, p: container(t, path, name)["secrets"].append({"name": variable, "valueFrom": value_from})

    # The policy cases likewise change or remove one key of one statement.
    def set_statement(path, index, **fields):
        return lambda t, p: p[path]["Statement"][index].update(fields)

    def drop_from_statement(path, index, key):
        return lambda t, p: p[path]["Statement"][index].pop(key)

    sealer_role = "arn:aws:iam::${ACCOUNT_ID}:role/leasehold-credential-sealer-task"
    cases = [
        ("stopTimeout below the drain", set_fields(stream, "stream-worker", stopTimeout=20),
         "would SIGKILL the worker mid-drain"),
        ("drain longer than stopTimeout", set_env(stream, "stream-worker", "DRAIN_TIMEOUT_MS", "60000"),
         "would SIGKILL the worker mid-drain"),
        ("stopTimeout over Fargate's maximum", set_fields(broker, "broker-worker", stopTimeout=300),
         "exceeds Fargate's maximum"),
        ("no dependsOn", drop_field(stream, "stream-worker", "dependsOn"), "dependsOn must name 'sidecar'"),
        ("no sidecar health check", drop_field(broker, "sidecar", "healthCheck"), "missing healthCheck"),
        ("metrics port not published", set_fields(stream, "sidecar", portMappings=[]),
         "portMappings lacks containerPort 9464"),
        ("unknown variable", set_env(stream, "stream-worker", "LEASE_TABEL", "x"),
         "LEASE_TABEL is not a variable the binary reads"),
        ("secret in plain environment", set_env(broker, "broker-worker", "CREDENTIALS_KEY", "AAAA"),
         "CREDENTIALS_KEY is a secret"),
        ("another role's Redis user", lambda t, p: container(t, stream, "sidecar")["secrets"].__setitem__(
            0, {"name": "REDIS_URL", "valueFrom": "${REDIS_URL_BROKER_WORKER_SECRET_ARN}"}),
         "each role connects as its own Redis user"),
        ("local key on ECS", add_secret(sealer, "credential-sealer", "CREDENTIALS_KEY", "${SINK_URL_SECRET_ARN}"),
         "a local key is refused on ECS"),
        ("sealer without a KMS key", drop_env(sealer, "credential-sealer", "CREDENTIALS_KMS_KEY_ID"),
         "CREDENTIALS_KMS_KEY_ID must be set"),
        ("broker worker given the KMS key back",
         set_env(broker, "broker-worker", "CREDENTIALS_KMS_KEY_ID", "${CREDENTIALS_KMS_KEY_ARN}"),
         "CREDENTIALS_KMS_KEY_ID: the broker worker holds no credentials key"),
        ("broker worker given a local key",
         add_secret(broker, "broker-worker", "CREDENTIALS_KEY", "${SINK_URL_SECRET_ARN}"),
         "CREDENTIALS_KEY: the broker worker holds no credentials key"),
        ("broker worker without a sealer URL", drop_env(broker, "broker-worker", "CREDENTIALS_SEALER_URL"),
         "CREDENTIALS_SEALER_URL must be set"),
        ("sealer URL on another port",
         set_env(broker, "broker-worker", "CREDENTIALS_SEALER_URL", "https://${CREDENTIALS_SEALER_HOST}:9481"),
         "differs from the sealer's SEALER_LISTEN port 9480"),
        ("broker task runs as the sealer's role", lambda t, p: t[broker].update(taskRoleArn=sealer_role),
         "taskRoleArn must be the leasehold-broker-worker-task role"),
        ("another task gets the sealer's role",
         lambda t, p: t["deploy/task-definitions/dashboard.json"].update(taskRoleArn=sealer_role),
         "only the credential sealer gets kms:Decrypt"),
        ("a sidecar in the sealer's task", lambda t, p: t[sealer]["containerDefinitions"].append(
            copy.deepcopy(container(t, broker, "sidecar"))), "shares the credential sealer's task"),
        ("sealer on loopback", set_env(sealer, "credential-sealer", "SEALER_LISTEN", "127.0.0.1:9480"),
         "SEALER_LISTEN is loopback"),
        ("sealer port not published", set_fields(sealer, "credential-sealer", portMappings=[]),
         "portMappings lacks containerPort 9480"),
        ("sealer health check elsewhere", drop_field(sealer, "credential-sealer", "healthCheck"),
         "healthCheck must request /healthz on the SEALER_METRICS_LISTEN port 9481"),
        ("sealer without TLS", lambda t, p: container(t, sealer, "credential-sealer").update(
            secrets=[s for s in container(t, sealer, "credential-sealer")["secrets"]
                     if s["name"] != "SEALER_TLS_KEY"]), "SEALER_TLS_KEY must come from `secrets`"),
        ("sealer metrics on the TLS port", drop_env(sealer, "credential-sealer", "SEALER_METRICS_LISTEN"),
         "SEALER_METRICS_LISTEN must be set"),
        ("worker asks the sealer in plain HTTP", set_env(broker, "broker-worker", "CREDENTIALS_SEALER_URL",
                                                          "http://${CREDENTIALS_SEALER_HOST}:9480"),
         "CREDENTIALS_SEALER_URL must be https://"),
        ("no sealer task", lambda t, p: t.pop(sealer), "no task definition runs credential-sealer"),
        ("password in a URL", set_env(stream, "stream-worker", "UPSTREAM_URL", "wss://u:hunter2@feed/x"),
         "holds a credential"),
        ("essential not explicit", drop_field(stream, "sidecar", "essential"), "essential must be set explicitly"),
        ("unknown subcommand", set_fields(stream, "stream-worker", command=["stream-wroker"]),
         "is not a leasehold subcommand"),
        ("no log configuration", drop_field(broker, "broker-worker", "logConfiguration"), "missing logConfiguration"),
        ("telemetry address mismatch", set_env(stream, "sidecar", "TELEMETRY_ADDR", "127.0.0.1:9999"),
         "differs from its sidecar's"),
        ("not a Fargate size", lambda t, p: t[stream].update(memory="3000"), "is not a Fargate task size"),
        ("DynamoDB on every table", set_statement(observer, 1, Resource="*"), "must be the lease table's ARN"),
        ("unconditioned wildcard resource",
         drop_from_statement("deploy/iam/maintenance-task-policy.json", 0, "Condition"), "needs a Condition"),
        ("unknown placeholder", lambda t, p: t[stream].update(family="${FAMILY}"), "unknown placeholder"),
        ("broker worker allowed an unpinned kms:Decrypt", lambda t, p: p[broker_policy]["Statement"].append(
            unpinned_decrypt), "allows a KMS action (kms:Decrypt)"),
        ("broker worker allowed KMS through NotAction", lambda t, p: p[broker_policy]["Statement"].append(
            {"Effect": "Allow", "NotAction": ["s3:*"], "Resource": "*"}), "allows a KMS action (NotAction"),
        ("broker worker loses its Deny of kms:*", set_statement(broker_policy, 0, Action="kms:Decrypt"),
         "no unconditional Deny of kms:*"),
        ("sealer Decrypt without the encryption context", drop_from_statement(sealer_policy, 0, "Condition"),
         "kms:Decrypt without the encryption-context condition"),
        ("sealer Decrypt without the Null condition", lambda t, p: p[sealer_policy]["Statement"][0]["Condition"]
         .pop("Null"), "Null kms:EncryptionContext:user_id"),
        ("sealer Decrypt on every key", set_statement(sealer_policy, 0, Resource="*"),
         "KMS resource must be ${CREDENTIALS_KMS_KEY_ARN} only"),
        ("sealer allowed more than Decrypt",
         set_statement(sealer_policy, 0, Action=["kms:Decrypt", "kms:GenerateDataKey"]),
         "the credential sealer needs kms:Decrypt only"),
        ("launcher overrides the wrong container", set_env(
            "deploy/task-definitions/pool-manager.json", "pool-manager", "ECS_CONTAINER_NAME", "worker"),
         "is not the container running broker-worker"),
        ("maintenance watches another pool", set_env(
            "deploy/task-definitions/maintenance.json", "maintenance", "POOL_GROUP", "other-pool"),
         "POOL_GROUP differs between launchers"),
        ("mark TTL disagrees", set_env(broker, "broker-worker", "WORKER_MARK_TTL_SECONDS", "60"),
         "WORKER_MARK_TTL_SECONDS differs"),
        ("misspelt ECS field", set_fields(broker, "broker-worker", stopTimeOut=30),
         'Unknown parameter in containerDefinitions[0]: "stopTimeOut"'),
        ("mistyped ECS field", lambda t, p: container(t, stream, "sidecar")["healthCheck"].update(interval="5"),
         "Invalid type for parameter containerDefinitions[1].healthCheck.interval"),
    ]
    failed = 0
    for title, breaks, expected in cases:
        t, p = copy.deepcopy(task_defs), copy.deepcopy(policies)
        breaks(t, p)
        errors, _ = check_all(t, p, lease_table, acl, readme, code)
        if not any(expected in e for e in errors):
            failed += 1
            print(f"self-test FAILED: {title}: no error containing {expected!r}; got {errors}")
    errors, _ = check_all(task_defs, policies, lease_table.replace("Tags:", "TimeToLiveSpecification:\n        Enabled: true\n      Tags:"), acl, readme, code)
    if not any("TTL must not be enabled" in e for e in errors):
        failed += 1
        print("self-test FAILED: TTL on the lease table was not caught")
    # The Redis ACL: each rule added to a copy of a user's line, one at a time.
    # None = the copy must still pass (the rule is undone or harmless).
    acl_cases = [
        ("broker-worker", "%R~credentials:*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "~credentials:*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "%RW~credentials:*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "~*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "allkeys", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "~cred*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "%R~credentials:alice", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "%R~[a-c]redentials:?*", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "(%R~credentials:* +get)", "user broker-worker can read credentials:* keys"),
        ("broker-worker", "%W~credentials:*", "user broker-worker can write credentials:* keys"),
        ("dashboard", "%R~credentials:*", "user dashboard can read credentials:* keys"),
        ("credential-sealer", "%W~trading:response:*", "user credential-sealer may write"),
        ("broker-worker", "~worker:active:*", "may write worker:active:alice"),
        ("broker-worker", "%W~worker:active:a*", "may write worker:active:alice"),
        ("broker-worker", "~pool:holder*", "may write pool:holder:alice"),
        ("broker-worker", "+scan", "may not list keys"),
        ("broker-worker", "~credentials:* resetkeys ~worker:active:-1:*", None),
        ("broker-worker", "(~credentials:* +get) clearselectors", None),
        ("broker-worker", "%R~credit:* %R~[^c]redentials:*", None),
    ]
    for user, rule, expected in acl_cases:
        broken = re.sub(rf"^(user {re.escape(user)} .*)$", lambda m: f"{m.group(1)} {rule}", acl, count=1, flags=re.M)
        assert broken != acl, user
        errors, _ = check_all(task_defs, policies, lease_table, broken, readme, code)
        if expected is None and errors:
            failed += 1
            print(f"self-test FAILED: {user} + {rule!r} must pass; got {errors}")
        elif expected is not None and not any(expected in e for e in errors):
            failed += 1
            print(f"self-test FAILED: {user} + {rule!r}: no error containing {expected!r}; got {errors}")
    # A Redis ACL file's `reset` undoes every rule before it.
    broken = re.sub(r"^user broker-worker on ", "user broker-worker on ~* reset on ", acl, flags=re.M)
    if check_all(task_defs, policies, lease_table, broken, readme, code)[0]:
        failed += 1
        print("self-test FAILED: `~* reset` on broker-worker was reported, though reset removes ~*")
    errors, _ = check_all(task_defs, policies, lease_table, acl, readme, code)
    if errors:
        failed += 1
        print("self-test FAILED: the unbroken files do not pass:\n  " + "\n  ".join(errors))
    must_pass = sum(1 for *_, expected in acl_cases if expected is None) + 1  # + the `reset` case
    total = len(cases) + len(acl_cases) + 2
    print(f"self-test: {total - failed} of {total} right ({total - must_pass} broken copies must be caught, "
          f"{must_pass} harmless ACL rules must pass)" +
          ("" if not failed else f", {failed} FAILED"))
    return 1 if failed else 0


def render(text: str) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: SAMPLES.get(m.group(1), m.group(0)), text)


def iam_template() -> str:
    """Every deploy/iam policy as a resource of one template, placeholders filled in."""
    resources = {}
    for path in sorted(IAM.glob("*.json")):
        document = json.loads(render(path.read_text()))
        logical = "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]", path.stem))
        if any("Principal" in st for st in statements(document)):
            resources[logical] = {"Type": "AWS::IAM::Role",
                                  "Properties": {"AssumeRolePolicyDocument": document}}
        else:
            resources[logical] = {"Type": "AWS::IAM::ManagedPolicy",
                                  "Properties": {"PolicyDocument": document}}
    return json.dumps({"AWSTemplateFormatVersion": "2010-09-09",
                       "Description": "deploy/iam/*.json wrapped for cfn-lint (generated; not for deployment)",
                       "Resources": resources}, indent=2)


def main(argv: list[str]) -> int:
    if "--iam-template" in argv:
        print(iam_template())
        return 0
    code = Code()
    if "--self-test" in argv:
        return self_test(code)
    load_errors, task_defs, policies, lease_table, acl, readme = inputs()
    errors, notes = check_all(task_defs, policies, lease_table, acl, readme, code)
    errors = load_errors + errors
    for note in sorted(notes):
        print(f"note: {note}")
    if errors:
        print("\n".join(f"error: {e}" for e in errors))
        print(f"{len(errors)} problem(s) in deploy/")
        return 1
    print(f"ok: {len(task_defs)} task definitions and {len(policies)} IAM policies match "
          f"the code ({len(code.env)} variables, {len(code.subcommands)} subcommands)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
