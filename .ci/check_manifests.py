#!/usr/bin/env python3
"""Checks that the Kubernetes manifests and the Dockerfile match the code.

Renders every overlay under k8s/overlays with `kubectl kustomize` and checks,
for each muster service (a directory services/<name> with a src/main.rs and a
`pub const DEFAULT_PORT`):

- it has exactly one Deployment per overlay, whose image is muster-<name>
  (a binary the workspace builds and the Dockerfile can put in an image);
- MUSTER_LISTEN is set to a non-loopback address whose port is the container's
  grpc port and the target of its Service; MUSTER_HEALTH_LISTEN, when set, is
  the container's health port; the liveness, readiness and startup probes
  (native gRPC probes on grpc.health.v1.Health) target the health port, or the
  grpc port when there is none (never a TLS port: the kubelet cannot do TLS);
- every MUSTER_* variable the manifests set (env, envFrom ConfigMaps) is one
  the service reads: an `env = "MUSTER_..."` attribute in services/runtime/src
  (config.rs, auth/mod.rs, ...), client/src (tls.rs: the runtime links
  muster-client) or services/<name>/src;
- every MUSTER_<SERVICE>_URL the service reads (but its own) is set, names the
  Service and port of that other service, and is https:// exactly when that
  service serves TLS; database URLs come from a Secret (and, when the overlay
  generates it, point at a Service of the overlay);
- credentials are files of read-only, whole (no subPath), non-optional Secret
  volumes: MUSTER_OPERATORS_FILE always, MUSTER_SERVICE_SECRET_FILE unless
  mutual TLS identifies the services, never MUSTER_OPERATORS or
  MUSTER_SERVICE_SECRET inline; when the overlay generates those Secrets,
  their content is valid (operator lines, a long enough service secret);
- TLS is all or nothing per overlay: MUSTER_TLS_CERT_FILE, _KEY_FILE and
  _CA_FILE together, in mounted Secret volumes, the same client-auth mode
  everywhere, and the Services' appProtocol says h2c or https accordingly;
- paths the service writes (MUSTER_DATA_DIR, MUSTER_MEMORY_DIR, MUSTER_PORT_FILE)
  are on writable volumes, since the root filesystem is read-only;
- the pod is locked down (non-root, read-only root filesystem, no privilege
  escalation, all capabilities dropped, RuntimeDefault seccomp, no service
  account token, no service links) and its termination grace period outlasts
  MUSTER_SHUTDOWN_GRACE_SECONDS;
- the NetworkPolicies allow exactly the edges of the design and nothing else,
  and none of them opens the health port (health and /metrics, no credentials);
- every resource carries app.kubernetes.io/part-of: muster and app.kubernetes.io/name.

The console (console/, a `pub const DEFAULT_PORT` in its src/lib.rs: web pages
over HTTP/1.1, a client of some of the services) is checked the same way where
that applies:

- it has no powers of its own: its code reads no credential variable
  (MUSTER_SERVICE_SECRET_FILE, MUSTER_OPERATORS_FILE and their inline forms),
  its manifests set none, and its pod uses none of the Secrets the services
  use (the service secret, the operators file, their TLS keys, the database
  URLs), so whatever it does, it does with the signed-in user's token;
- one Deployment, image muster-console; every MUSTER_* variable is one its
  code reads (console/src, and client/src/tls.rs for the TlsArgs it flattens);
  MUSTER_LISTEN on its DEFAULT_PORT, the container's http port and the target
  of its Service (appProtocol http: plain, TLS ends at the ingress);
  liveness, readiness and startup probes are HTTP GETs of the health path its
  router serves (/healthz), on that port;
- every MUSTER_<SERVICE>_URL it reads is set and reaches that service, with
  https:// exactly when the service serves TLS; under TLS it has the CA, and
  under mutual TLS its own client certificate (cert and key) from a mounted
  Secret; it never sets MUSTER_TLS_CLIENT_AUTH (it serves no TLS);
- MUSTER_CONSOLE_SESSION_KEY_FILE is set, a file of a read-only, whole,
  non-optional Secret volume (its replicas share the key), well-formed when
  the overlay generates it (32 bytes or 64 hex digits); with TLS on in the
  overlay, MUSTER_CONSOLE_SECURE_COOKIES is true;
- the same pod lockdown as the services;
- its NetworkPolicy admits the design's sources to its port and nothing else,
  the services it calls admit it (and no other service does), and its egress
  is restricted to exactly those services' gRPC ports and DNS.

It also checks the Dockerfile against rust-toolchain.toml and the workspace
(Rust version, the SERVICE list, the packages it builds), and that the prod
overlay's image tag is the workspace version.

Exits 1 with one line per problem ("drift: ..."), 0 when all is consistent.
`--self-test` breaks the rendered dev and prod overlays in known ways (a wrong
port, an unknown variable, an extra network edge, a missing credential, an
http:// URL under TLS, ...) and checks each is reported.
Needs PyYAML (installed with kubernetes-validate) and kubectl.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ROOT / "k8s" / "overlays"

# The design's edges: who may open a connection to whom. "client" and "worker"
# are pods outside the namespace labelled muster.dev/client: "true" or
# muster.dev/worker: "true". Every service but the roster follows the roster's
# agent credentials (WatchCredentials), hence the roster's sources. The
# validator serves clients only: the execution service checks what it
# publishes in-process, with the muster-format library.
ALLOWED_SOURCES = {
    "execution": {"client", "worker", "console"},
    "roster": {"execution", "validator", "notifier", "client", "console"},
    "validator": {"client", "console"},
    "notifier": {"execution", "client", "worker"},
    # The console's web port: clients, in practice the ingress controller's
    # pods, which terminate TLS. The console calls exactly the services whose
    # sources list it (the services whose MUSTER_<SERVICE>_URL it reads).
    "console": {"client"},
}
CONSOLE = "console"
# Where a pod's DNS questions go (kube-dns, CoreDNS): the console's egress
# policy must let them through.
CLUSTER_DNS = ({"k8s-app": "kube-dns"}, "kube-system")
EXTERNAL_SOURCES = {
    "client": {"muster.dev/client": "true"},
    "worker": {"muster.dev/worker": "true"},
    # A pod of another namespace with no muster label: reaches nothing.
    "stranger": {"app.kubernetes.io/name": "something-else"},
}
# Prometheus, in its own namespace: it may reach the health ports (for
# /metrics) of an overlay that has a PodMonitor, and nothing else.
PROMETHEUS = ({"app.kubernetes.io/name": "prometheus"}, "monitoring")
# Read by the code for tests only (crash failpoints, test databases): a
# manifest that sets one is a mistake.
TEST_ONLY = re.compile(r"^MUSTER_TEST_|FAILPOINT")
WRITTEN_PATHS = ("MUSTER_DATA_DIR", "MUSTER_MEMORY_DIR", "MUSTER_PORT_FILE")
# Credentials (services/runtime/src/auth/mod.rs, client/src/tls.rs): files of mounted
# Secrets. The inline forms would put them in a ConfigMap or the pod spec, or
# (from a secretKeyRef) freeze them until a restart.
OPERATORS_FILE, SERVICE_SECRET_FILE = "MUSTER_OPERATORS_FILE", "MUSTER_SERVICE_SECRET_FILE"
INLINE_CREDENTIALS = {"MUSTER_OPERATORS": OPERATORS_FILE, "MUSTER_SERVICE_SECRET": SERVICE_SECRET_FILE}
TLS_FILES = ("MUSTER_TLS_CERT_FILE", "MUSTER_TLS_KEY_FILE", "MUSTER_TLS_CA_FILE")
CLIENT_AUTH_MODES = ("none", "optional", "required")
# What would give the console powers of its own: it must read none of them.
CREDENTIAL_VARIABLES = {OPERATORS_FILE, SERVICE_SECRET_FILE, *INLINE_CREDENTIALS}
SESSION_KEY_FILE = "MUSTER_CONSOLE_SESSION_KEY_FILE"
SECURE_COOKIES = "MUSTER_CONSOLE_SECURE_COOKIES"
# What the runtime (with the muster-client library it links) must read for
# these rules to mean anything.
RUNTIME_VARIABLES = {
    "MUSTER_LISTEN", "MUSTER_HEALTH_LISTEN", OPERATORS_FILE, SERVICE_SECRET_FILE, *INLINE_CREDENTIALS,
    *TLS_FILES, "MUSTER_TLS_CLIENT_AUTH", "MUSTER_ROSTER_URL",
}
# An operators file line (services/runtime/src/auth/operators.rs): NAME SHA256.
OPERATOR_LINE = re.compile(r"[A-Za-z0-9._@-]{1,64}\s+[0-9a-fA-F]{64}")
# clap's `env = "MUSTER_..."`, and direct reads with std::env::var("MUSTER_...").
ENV_READ = re.compile(r'(?:\benv\s*=\s*|\benv::var(?:_os)?\(\s*)"(MUSTER_[A-Z0-9_]+)"')

problems: list[str] = []


def drift(message: str) -> None:
    problems.append(message)


# --- what the code says ---------------------------------------------------


@dataclass
class ServiceCode:
    name: str
    default_port: int
    variables: set[str]
    binaries: set[str]


@dataclass
class ConsoleCode:
    default_port: int
    variables: set[str]
    binaries: set[str]
    health_path: str  # the route that answers 200 without calling the cluster
    calls: set[str]  # the services whose MUSTER_<SERVICE>_URL it reads


@dataclass
class Code:
    """What the checks compare the manifests with."""

    services: dict[str, ServiceCode]
    console: ConsoleCode | None  # None: the workspace has no console
    grace_default: int  # MUSTER_SHUTDOWN_GRACE_SECONDS
    secret_min_bytes: int  # the service secret's least length
    version: str  # the workspace version, the prod image tag


def read_variables(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        found.update(ENV_READ.findall(path.read_text(encoding="utf-8")))
    return found


def discover_services() -> dict[str, ServiceCode]:
    # What every service reads through muster-runtime (ServerArgs in config.rs,
    # and anything else its sources read) and the muster-client library it
    # links (TlsArgs in tls.rs), except the test-only support.
    runtime = ROOT / "services" / "runtime" / "src"
    client = ROOT / "client" / "src"
    shared = read_variables(
        [path for source in (runtime, client) for path in sorted(source.rglob("*.rs")) if path.name != "testing.rs"]
    )
    if not RUNTIME_VARIABLES <= shared:
        sys.exit(
            f"check_manifests: services/runtime/src and client/src no longer read {sorted(RUNTIME_VARIABLES - shared)} "
            "(runtime: config.rs, auth/mod.rs; client: tls.rs); update this script"
        )
    services = {}
    for directory in sorted((ROOT / "services").iterdir()):
        main, lib = directory / "src" / "main.rs", directory / "src" / "lib.rs"
        if not main.is_file() or not lib.is_file():
            continue
        port = re.search(r"pub const DEFAULT_PORT: u16 = (\d+);", lib.read_text(encoding="utf-8"))
        if not port:
            drift(f"services/{directory.name}: has a src/main.rs but no `pub const DEFAULT_PORT: u16 = N;` in src/lib.rs")
            continue
        manifest = tomllib.loads((directory / "Cargo.toml").read_text(encoding="utf-8"))
        binaries = {binary["name"] for binary in manifest.get("bin", [])} or {manifest["package"]["name"]}
        services[directory.name] = ServiceCode(
            name=directory.name,
            default_port=int(port.group(1)),
            variables=shared | read_variables(sorted((directory / "src").rglob("*.rs"))),
            binaries=binaries,
        )
    if not services:
        sys.exit("check_manifests: found no service under services/")
    return services


def discover_console(services: dict[str, ServiceCode]) -> ConsoleCode | None:
    """The console's port, variables, health route and the services it calls."""
    directory = ROOT / CONSOLE
    lib = directory / "src" / "lib.rs"
    if not lib.is_file():
        return None
    source = lib.read_text(encoding="utf-8")
    port = re.search(r"pub const DEFAULT_PORT: u16 = (\d+);", source)
    health = re.search(r'\.route\(\s*"(/[^"]*health[^"]*)"', source)
    if not port or not health:
        sys.exit(
            "check_manifests: cannot read the console's DEFAULT_PORT or its health route (`.route(\"/healthz\", ...)`) "
            "in console/src/lib.rs; update this script"
        )
    variables = read_variables(sorted((directory / "src").rglob("*.rs")))
    # Settings structs of other crates flattened into its Config: the TLS
    # client settings (muster-client's TlsArgs) add their variables; the
    # services' AuthArgs would add the credentials; anything else is unknown.
    for flattened in re.findall(r"#\[command\(flatten\)\]\s*pub\s+\w+:\s*([\w:]+)", source):
        kind = flattened.rsplit("::", 1)[-1]
        if kind == "TlsArgs":
            variables |= read_variables([ROOT / "client" / "src" / "tls.rs"])
        elif kind == "AuthArgs":
            variables |= {OPERATORS_FILE, SERVICE_SECRET_FILE}
        else:
            sys.exit(f"check_manifests: the console's Config flattens {flattened}, whose variables this script does not know; update it")
    # A credential variable in the code is already a power: report it
    # whatever the manifests say.
    for variable in sorted(variables & CREDENTIAL_VARIABLES):
        drift(
            f"console/src: the console reads {variable}: it must hold no credential of its own "
            "(every call it makes carries the signed-in user's token)"
        )
    calls = {name for name in services if f"MUSTER_{name.upper()}_URL" in variables}
    designed = {name for name, sources in ALLOWED_SOURCES.items() if CONSOLE in sources}
    if calls != designed:
        sys.exit(
            f"check_manifests: the console calls {sorted(calls)} (the MUSTER_<SERVICE>_URL it reads), "
            f"ALLOWED_SOURCES admits it to {sorted(designed)}; update this script's design"
        )
    manifest = tomllib.loads((directory / "Cargo.toml").read_text(encoding="utf-8"))
    return ConsoleCode(
        default_port=int(port.group(1)),
        variables=variables,
        binaries={binary["name"] for binary in manifest.get("bin", [])} or {manifest["package"]["name"]},
        health_path=health.group(1),
        calls=calls,
    )


def runtime_number(path: str, pattern: str, what: str) -> int:
    source = (ROOT / "services" / "runtime" / "src" / path).read_text(encoding="utf-8")
    match = re.search(pattern, source)
    if not match:
        sys.exit(f"check_manifests: cannot read {what} in services/runtime/src/{path}; update this script")
    return int(match.group(1))


def read_code() -> Code:
    services = discover_services()
    return Code(
        services=services,
        console=discover_console(services),
        grace_default=runtime_number(
            "config.rs", r'env = "MUSTER_SHUTDOWN_GRACE_SECONDS", default_value_t = (\d+)', "the MUSTER_SHUTDOWN_GRACE_SECONDS default"
        ),
        secret_min_bytes=runtime_number("auth/token.rs", r"const MIN_SECRET_BYTES: usize = (\d+);", "MIN_SECRET_BYTES"),
        version=tomllib.loads((ROOT / "Cargo.toml").read_text(encoding="utf-8"))["workspace"]["package"]["version"],
    )


# --- the rendered manifests -------------------------------------------------


@dataclass
class Rendered:
    overlay: str
    namespace: str
    documents: list[dict]
    by_kind: dict[str, list[dict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for document in self.documents:
            self.by_kind.setdefault(document["kind"], []).append(document)

    def find(self, kind: str, name: str) -> dict | None:
        return next((d for d in self.by_kind.get(kind, []) if d["metadata"]["name"] == name), None)

    def secret_data(self, name: str) -> dict[str, str] | None:
        """The decoded keys of Secret `name`; None when the overlay does not
        make it (the operator creates it)."""
        secret = self.find("Secret", name)
        if secret is None:
            return None
        # surrogateescape: a raw binary key (the console's 32-byte session
        # key) decodes too, and encodes back to its bytes.
        data = {key: base64.b64decode(value).decode("utf-8", "surrogateescape") for key, value in (secret.get("data") or {}).items()}
        data.update(secret.get("stringData") or {})
        return data


def render(overlay: Path) -> Rendered:
    result = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"check_manifests: kubectl kustomize {overlay} failed:\n{result.stderr}")
    documents = [document for document in yaml.safe_load_all(result.stdout) if document]
    namespaces = {d["metadata"].get("namespace") for d in documents if d["kind"] != "Namespace"}
    if len(namespaces) != 1 or None in namespaces:
        drift(f"{overlay.name}: every resource needs the overlay's one namespace, found {sorted(map(str, namespaces))}")
    return Rendered(overlay.name, next(iter(namespaces)) or "", documents)


def selects(selector: dict | None, labels: dict) -> bool:
    """Whether a LabelSelector selects these labels (None selects nothing)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


# --- one Deployment ----------------------------------------------------------


# The pod's own fields a variable may take from the downward API.
POD_FIELDS = {"status.podIP", "metadata.name", "metadata.namespace"}


@dataclass
class Environment:
    values: dict[str, str]  # literal values, from env or ConfigMaps
    secrets: dict[str, tuple[str, str]]  # name -> (secret, key)


@dataclass
class Tls:
    serves: bool  # a certificate: the main port speaks TLS only
    client_auth: str  # MUSTER_TLS_CLIENT_AUTH

    @property
    def mutual(self) -> bool:
        """Client certificates required: a certificate identifies a service."""
        return self.serves and self.client_auth == "required"


@dataclass
class ServicePod:
    """A service's pods, as the checks across services see them."""

    labels: dict
    container: dict
    port: int  # MUSTER_LISTEN
    health: int | None  # MUSTER_HEALTH_LISTEN
    tls: Tls


def environment(rendered: Rendered, where: str, container: dict) -> Environment:
    values: dict[str, str] = {}
    secrets: dict[str, tuple[str, str]] = {}
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            config_map = rendered.find("ConfigMap", name)
            if config_map is None:
                drift(f"{where}: envFrom ConfigMap {name} is not in the overlay")
                continue
            prefix = source.get("prefix", "")
            values.update({prefix + key: str(value) for key, value in (config_map.get("data") or {}).items()})
        else:
            drift(f"{where}: envFrom {sorted(source)} hides which variables are set; use env with secretKeyRef")
    defined: set[str] = set(values)
    for variable in container.get("env") or []:
        name = variable["name"]
        if name in values or name in secrets:
            drift(f"{where}: {name} is set twice (env overrides envFrom): keep one")
        if "value" in variable:
            # Kubernetes expands $(VAR) only for a variable defined earlier
            # in the list; a later one stays as the literal text.
            for reference in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(variable["value"])):
                if reference not in defined:
                    drift(f"{where}: {name} uses $({reference}), which is not defined before it in env: it stays as text")
            values[name] = str(variable["value"])
        elif "secretKeyRef" in (variable.get("valueFrom") or {}):
            reference = variable["valueFrom"]["secretKeyRef"]
            secrets[name] = (reference["name"], reference["key"])
            values.pop(name, None)
        elif "configMapKeyRef" in (variable.get("valueFrom") or {}):
            reference = variable["valueFrom"]["configMapKeyRef"]
            config_map = rendered.find("ConfigMap", reference["name"])
            if config_map is None or reference["key"] not in (config_map.get("data") or {}):
                drift(f"{where}: {name} refers to {reference['name']}/{reference['key']}, not in the overlay")
            else:
                values[name] = str(config_map["data"][reference["key"]])
        elif (variable.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") in POD_FIELDS:
            # Known only when the pod runs (the downward API): kept as the
            # reference, for the variables that use it.
            values[name] = "<" + variable["valueFrom"]["fieldRef"]["fieldPath"] + ">"
        else:
            drift(f"{where}: {name} is set from {sorted(variable.get('valueFrom') or {})}, which this check cannot read")
        defined.add(name)
    return Environment(values, secrets)


def check_security(where: str, pod: dict, container: dict) -> None:
    pod_context = pod.get("securityContext") or {}
    context = container.get("securityContext") or {}

    def setting(key: str):
        return context.get(key, pod_context.get(key))

    if setting("runAsNonRoot") is not True:
        drift(f"{where}: runAsNonRoot must be true")
    if context.get("readOnlyRootFilesystem") is not True:
        drift(f"{where}: readOnlyRootFilesystem must be true")
    if context.get("allowPrivilegeEscalation") is not False:
        drift(f"{where}: allowPrivilegeEscalation must be false")
    if context.get("privileged"):
        drift(f"{where}: must not be privileged")
    if (context.get("capabilities") or {}).get("drop") != ["ALL"] or (context.get("capabilities") or {}).get("add"):
        drift(f"{where}: capabilities must drop ALL and add none")
    if (setting("seccompProfile") or {}).get("type") != "RuntimeDefault":
        drift(f"{where}: seccompProfile must be RuntimeDefault")
    fs_group = pod_context.get("fsGroup")
    if not isinstance(fs_group, int) or fs_group == 0:
        drift(f"{where}: fsGroup must be set, and not 0: the pod's volumes are the service's group's (docs/security.md, data at rest)")
    for volume in pod.get("volumes") or []:
        secret = volume.get("secret")
        if secret is None:
            continue
        # Kubernetes' own default is 0644: readable by every user of the node's pod.
        modes = [secret.get("defaultMode", 0o644)] + [item["mode"] for item in secret.get("items") or [] if "mode" in item]
        if any(mode != 0o400 for mode in modes):
            drift(
                f"{where}: Secret volume {volume['name']} has defaultMode {' '.join(oct(mode) for mode in modes)}; "
                "use 0400 (the kubelet adds read for the fsGroup)"
            )
    if pod.get("automountServiceAccountToken") is not False:
        drift(f"{where}: automountServiceAccountToken must be false (the services call no Kubernetes API)")
    if pod.get("enableServiceLinks") is not False:
        drift(f"{where}: enableServiceLinks must be false (service links inject MUSTER_<SERVICE>_* variables)")


def socket_port(where: str, variable: str, listen: str) -> int | None:
    """The port of a listen address, which must not be loopback."""
    host, _, port = listen.rpartition(":")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        drift(f"{where}: {variable}={listen!r} is not an IP:port socket address")
        return None
    if address.is_loopback:
        drift(f"{where}: {variable}={listen} listens on loopback: probes and Services cannot reach it")
    return number


def listen_port(where: str, env: Environment) -> int | None:
    listen = env.values.get("MUSTER_LISTEN")
    if listen is None:
        drift(
            f"{where}: MUSTER_LISTEN is not set; set it to 0.0.0.0:<port> (the built-in defaults differ "
            "per service, and the roster's listens on 127.0.0.1 only)"
        )
        return None
    return socket_port(where, "MUSTER_LISTEN", listen)


def health_port(where: str, container: dict, env: Environment, port: int) -> int | None:
    """MUSTER_HEALTH_LISTEN's port, declared as the container's health port."""
    listen = env.values.get("MUSTER_HEALTH_LISTEN")
    if listen is None:
        return None
    number = socket_port(where, "MUSTER_HEALTH_LISTEN", listen)
    if number is None:
        return None
    if number == port:
        drift(f"{where}: MUSTER_HEALTH_LISTEN and MUSTER_LISTEN both use port {port}; the health port needs its own")
    declared = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == "health"]
    if declared != [number]:
        drift(f"{where}: the container's health port is {declared}, MUSTER_HEALTH_LISTEN says {number}")
    return number


def check_probes(where: str, container: dict, port: int, health: int | None, tls: Tls) -> None:
    """The kubelet's gRPC probes speak plain text without credentials: they
    target the health port, or the main port when it is plain."""
    if health is None and tls.serves:
        drift(
            f"{where}: the main port speaks TLS only, which the kubelet's gRPC probes cannot: "
            "set MUSTER_HEALTH_LISTEN, declare a health port and probe it"
        )
    expected = port if health is None else health
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if probe is None:
            if probe_name != "startupProbe":
                drift(f"{where}: no {probe_name}")
            continue
        grpc = probe.get("grpc")
        if grpc is None:
            drift(f"{where}: {probe_name} must be a native grpc probe (grpc.health.v1.Health)")
            continue
        if grpc.get("port") != expected:
            drift(
                f"{where}: {probe_name} probes port {grpc.get('port')}, "
                + (f"the service listens on {port}" if health is None else f"the health port (MUSTER_HEALTH_LISTEN) is {health}")
            )
        if grpc.get("service", "") != "":
            drift(f"{where}: {probe_name} asks for health service {grpc['service']!r}; the overall status is \"\"")


def check_written_paths(where: str, pod: dict, container: dict, env: Environment, code: ServiceCode | ConsoleCode) -> None:
    writable = [
        mount["mountPath"].rstrip("/")
        for mount in container.get("volumeMounts") or []
        if not mount.get("readOnly")
    ]
    volumes = {volume["name"]: volume for volume in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            drift(f"{where}: volumeMount {mount['name']} has no volume")
    wanted = [name for name in WRITTEN_PATHS if name in env.values]
    if "MUSTER_DATA_DIR" in code.variables and "MUSTER_DATA_DIR" not in env.values:
        drift(f"{where}: MUSTER_DATA_DIR is not set; its default is relative to a read-only root filesystem")
    for name in wanted:
        path = env.values[name]
        checked = str(Path(path).parent) if name == "MUSTER_PORT_FILE" else path
        if not path.startswith("/"):
            drift(f"{where}: {name}={path} must be absolute (the root filesystem is read-only)")
        elif not any(checked == mount or checked.startswith(mount + "/") for mount in writable):
            drift(f"{where}: {name}={path} is not on a writable volume; mounts: {writable or 'none'}")


def check_service_exposure(rendered: Rendered, where: str, name: str, pod_labels: dict, port: int, container: dict, tls: Tls) -> None:
    """The Service muster-<name> selects the pods, forwards to the grpc port
    and names its protocol: HTTP/2 in clear text (h2c) or over TLS (https)."""
    service = rendered.find("Service", f"muster-{name}")
    selector = (service or {}).get("spec", {}).get("selector") or {}
    if service is None or not selector or not selects({"matchLabels": selector}, pod_labels):
        drift(f"{where}: no Service muster-{name} selects its pods")
        return
    named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    headless = service["spec"].get("clusterIP") == "None"
    for service_port in service["spec"].get("ports") or []:
        target = service_port.get("targetPort", service_port["port"])
        resolved = named.get(target) if isinstance(target, str) else target
        if resolved != port:
            drift(f"{where}: Service muster-{name} port {service_port['port']} forwards to {target!r}, the service listens on {port}")
        elif headless and service_port["port"] != port:
            # Clients of a headless Service connect to the pods themselves,
            # at the URL's port: nothing maps it to the target port.
            drift(f"{where}: Service muster-{name} is headless: its port {service_port['port']} must be the pods' port {port}")
        protocol = "https" if tls.serves else "kubernetes.io/h2c"
        if service_port.get("appProtocol") != protocol:
            drift(
                f"{where}: Service muster-{name} port {service_port['port']} has appProtocol "
                f"{service_port.get('appProtocol')!r}; the port speaks {'TLS' if tls.serves else 'clear text'}: {protocol}"
            )


def resolve_url(rendered: Rendered, where: str, variable: str, url: str, target: str, pods: dict[str, ServicePod]) -> None:
    """Checks that `url` reaches the grpc port of the `target` service's pods,
    with TLS exactly when they serve it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        drift(f"{where}: {variable}={url} needs a scheme, a host and an explicit port")
        return
    labels = parts.hostname.split(".")
    if len(labels) > 1 and labels[1] != rendered.namespace:
        drift(f"{where}: {variable}={url} names namespace {labels[1]!r}, the overlay's is {rendered.namespace!r}")
    service = rendered.find("Service", labels[0])
    if service is None:
        drift(f"{where}: {variable}={url}: there is no Service {labels[0]!r}")
        return
    target_pod = pods.get(target)
    if target_pod is None:
        return
    scheme = "https" if target_pod.tls.serves else "http"
    if parts.scheme != scheme:
        drift(
            f"{where}: {variable}={url}: muster-{target} speaks "
            + ("TLS only" if target_pod.tls.serves else "plain text")
            + f" on that port: use {scheme}://"
        )
    pod_labels, container, target_port = target_pod.labels, target_pod.container, target_pod.port
    if not selects({"matchLabels": service["spec"].get("selector") or {}}, pod_labels) or not service["spec"].get("selector"):
        drift(f"{where}: {variable}={url}: Service {labels[0]} does not select the {target} pods")
        return
    ports = {p["port"]: p for p in service["spec"].get("ports") or []}
    if parts.port not in ports:
        drift(f"{where}: {variable}={url}: Service {labels[0]} has no port {parts.port} (it has {sorted(ports)})")
        return
    target_port_spec = ports[parts.port].get("targetPort", parts.port)
    if isinstance(target_port_spec, str):
        named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        resolved = named.get(target_port_spec)
    else:
        resolved = target_port_spec
    if resolved != target_port:
        drift(f"{where}: {variable}={url} reaches container port {resolved}, {target} listens on {target_port}")


def check_database_url(rendered: Rendered, where: str, env: Environment) -> None:
    if "MUSTER_DATABASE_URL" in env.values:
        drift(f"{where}: MUSTER_DATABASE_URL is a literal; take it from a Secret (secretKeyRef)")
        return
    if "MUSTER_DATABASE_URL" not in env.secrets:
        drift(f"{where}: MUSTER_DATABASE_URL is not set; the default is a SQLite file on a read-only filesystem")
        return
    secret_name, key = env.secrets["MUSTER_DATABASE_URL"]
    data = rendered.secret_data(secret_name)
    if data is None:
        return  # created by the operator (prod): nothing to compare
    if key not in data:
        drift(f"{where}: Secret {secret_name} has no key {key!r}")
        return
    url = urlsplit(data[key])
    if url.scheme not in ("postgres", "postgresql"):
        drift(f"{where}: the database URL in {secret_name}/{key} must be postgres:// (got {url.scheme}://)")
        return
    host = (url.hostname or "").split(".")[0]
    service = rendered.find("Service", host)
    if service is None:
        drift(f"{where}: the database URL in {secret_name}/{key} names host {url.hostname!r}, not a Service of the overlay")
    elif (url.port or 5432) not in {p["port"] for p in service["spec"].get("ports") or []}:
        drift(f"{where}: the database URL in {secret_name}/{key} uses port {url.port or 5432}, Service {host} has no such port")


# --- credentials and TLS -------------------------------------------------------


def mounted_secret_file(rendered: Rendered, where: str, pod: dict, container: dict, variable: str, path: str) -> str | None:
    """Checks that `path` (the value of `variable`) is a file of a Secret volume
    mounted whole and read-only; returns the file's content when the overlay
    generates that Secret, else None."""
    mounts = [
        mount
        for mount in container.get("volumeMounts") or []
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/")
    ]
    if not path.startswith("/") or not mounts:
        drift(f"{where}: {variable}={path} is on no mounted volume; mount the Secret that holds it")
        return None
    mount = max(mounts, key=lambda mount: len(mount["mountPath"]))
    if mount.get("readOnly") is not True:
        drift(f"{where}: {variable}: volume {mount['name']} must be mounted readOnly (credentials)")
    if mount.get("subPath") or mount.get("subPathExpr"):
        drift(f"{where}: {variable}: volume {mount['name']} is mounted with a subPath, which never sees the Secret change")
    volume = next((v for v in pod.get("volumes") or [] if v["name"] == mount["name"]), None)
    if volume is None:
        return None  # reported by check_written_paths
    secret = volume.get("secret")
    if secret is None:
        drift(f"{where}: {variable}={path} is on volume {mount['name']}, which is not a Secret")
        return None
    if secret.get("optional"):
        drift(f"{where}: {variable}: Secret volume {mount['name']} is optional; without the Secret the file is missing and the service stops")
    # A file mounted by itself (subPath) is the subPath's key.
    relative = mount.get("subPath", "") if path == mount["mountPath"] else path[len(mount["mountPath"].rstrip("/")) + 1 :]
    items = secret.get("items")
    key = next((item["key"] for item in items if item["path"] == relative), None) if items else relative
    if not key or "/" in key:
        drift(f"{where}: {variable}={path}: Secret {secret['secretName']} mounted at {mount['mountPath']} has no file {relative!r}")
        return None
    data = rendered.secret_data(secret["secretName"])
    if data is None:
        return None  # created by the operator: nothing to compare
    if key not in data:
        drift(f"{where}: {variable}={path}: Secret {secret['secretName']} has no key {key!r}")
        return None
    return data[key]


def check_credentials(rendered: Rendered, where: str, pod: dict, container: dict, env: Environment, tls: Tls, code: Code) -> None:
    """Operators and the service secret, from files of mounted Secrets."""
    inline_set = {inline for inline in INLINE_CREDENTIALS if inline in env.values or inline in env.secrets}
    for inline, file_variable in INLINE_CREDENTIALS.items():
        if inline in inline_set:
            drift(
                f"{where}: {inline} is set inline ("
                + ("a literal anyone reading the manifests sees" if inline in env.values else "a variable never sees its Secret change")
                + f"); use {file_variable} and a mounted Secret"
            )
    if OPERATORS_FILE not in env.values:
        if "MUSTER_OPERATORS" not in inline_set:
            drift(f"{where}: {OPERATORS_FILE} is not set: no operator could call the service")
    else:
        operators = mounted_secret_file(rendered, where, pod, container, OPERATORS_FILE, env.values[OPERATORS_FILE])
        if operators is not None:
            lines = [line.strip() for line in operators.splitlines() if line.strip() and not line.strip().startswith("#")]
            for line in lines:
                if not OPERATOR_LINE.fullmatch(line):
                    drift(f"{where}: the operators file has {line!r}; each line is `NAME SHA256` (muster operator add)")
            if not lines:
                drift(f"{where}: the operators file lists no operator")
    if SERVICE_SECRET_FILE not in env.values:
        if not tls.mutual and "MUSTER_SERVICE_SECRET" not in inline_set:
            drift(
                f"{where}: {SERVICE_SECRET_FILE} is not set and mutual TLS is off: the service has no "
                "service credential and refuses to start"
            )
        return
    secret = mounted_secret_file(rendered, where, pod, container, SERVICE_SECRET_FILE, env.values[SERVICE_SECRET_FILE])
    if secret is not None and len(secret.strip().encode()) < code.secret_min_bytes:
        drift(f"{where}: the service secret has {len(secret.strip().encode())} bytes; it needs at least {code.secret_min_bytes}")


def check_tls(rendered: Rendered, where: str, pod: dict, container: dict, env: Environment) -> Tls:
    """A certificate, its key and the CA, together, from mounted Secrets."""
    client_auth = env.values.get("MUSTER_TLS_CLIENT_AUTH", "none")
    if client_auth not in CLIENT_AUTH_MODES:
        drift(f"{where}: MUSTER_TLS_CLIENT_AUTH={client_auth!r}; it is one of {', '.join(CLIENT_AUTH_MODES)}")
    given = [variable for variable in TLS_FILES if variable in env.values or variable in env.secrets]
    if given and len(given) != len(TLS_FILES):
        drift(
            f"{where}: sets {given} but not {[v for v in TLS_FILES if v not in given]}: a service with TLS needs "
            "its certificate, its key and the CA (to check the other services and client certificates)"
        )
    for variable in given:
        if variable in env.secrets:
            drift(f"{where}: {variable} is a path; take it from the manifests, not from a Secret")
        else:
            mounted_secret_file(rendered, where, pod, container, variable, env.values[variable])
    tls = Tls(serves=bool({"MUSTER_TLS_CERT_FILE", "MUSTER_TLS_KEY_FILE"} & set(given)), client_auth=client_auth)
    if client_auth != "none" and not tls.serves:
        drift(f"{where}: MUSTER_TLS_CLIENT_AUTH={client_auth} without a certificate: the server speaks plain text")
    return tls


def check_overlay_tls(rendered: Rendered, pods: dict[str, ServicePod]) -> None:
    """TLS is all or nothing: a plain client cannot call a TLS server, and a
    server demanding client certificates refuses a caller without one."""
    serving = sorted(name for name, pod in pods.items() if pod.tls.serves)
    if serving and len(serving) != len(pods):
        drift(f"{rendered.overlay}: TLS is on for {serving} but not for {sorted(set(pods) - set(serving))}: turn it on for all or none")
    modes = {name: pod.tls.client_auth for name, pod in pods.items()}
    if len(set(modes.values())) > 1:
        drift(f"{rendered.overlay}: MUSTER_TLS_CLIENT_AUTH differs between services {modes}")


# --- the console ----------------------------------------------------------------


@dataclass
class ConsolePod:
    """The console's pods, as the network checks see them."""

    labels: dict
    port: int  # MUSTER_LISTEN: web pages and the health path


# The cluster's credentials by their names in the manifests (a generated
# Secret's name carries a hash suffix): the console may use none, whether or
# not a service uses it in this overlay.
CREDENTIAL_SECRETS = ("muster-service-secret", "muster-operators")


def secrets_used(pod: dict) -> set[str]:
    """The Secrets a pod reads: as volumes (plain or projected) and in any
    container's environment."""
    names: set[str] = set()
    for volume in pod.get("volumes") or []:
        if "secret" in volume:
            names.add(volume["secret"].get("secretName", ""))
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                names.add(source["secret"].get("name", ""))
    for each in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
        for variable in each.get("env") or []:
            reference = (variable.get("valueFrom") or {}).get("secretKeyRef")
            if reference:
                names.add(reference["name"])
        for source in each.get("envFrom") or []:
            if "secretRef" in source:
                names.add(source["secretRef"]["name"])
    return names - {""}


def check_no_powers(where: str, pod: dict, env: Environment, service_secrets: dict[str, set[str]]) -> None:
    """The console holds no credential: no credential variable, and none of
    the Secrets the services hold theirs in (the service secret, the operators
    file, their TLS keys, which under mutual TLS name a service, the database
    URLs)."""
    for variable in sorted((set(env.values) | set(env.secrets)) & CREDENTIAL_VARIABLES):
        drift(
            f"{where}: sets {variable}: the console must hold no credential of its own "
            "(every call it makes carries the signed-in user's token)"
        )
    for name in sorted(secrets_used(pod)):
        users = service_secrets.get(name, set())
        if users or any(name == base or name.startswith(base + "-") for base in CREDENTIAL_SECRETS):
            drift(
                f"{where}: uses Secret {name}"
                + (f" (used by muster-{', muster-'.join(sorted(users))})" if users else " (a cluster credential)")
                + ": the console must hold no credential of its own; it needs its session key and, under mutual "
                "TLS, a client certificate of its own that names no service"
            )


def session_key_ok(text: str) -> bool:
    """What the console accepts (console/src/session.rs): 64 hex digits,
    surrounding whitespace ignored, or exactly 32 bytes."""
    return bool(re.fullmatch(r"[0-9a-fA-F]{64}", text.strip())) or len(text.encode("utf-8", "surrogateescape")) == 32


def check_session_key(rendered: Rendered, where: str, pod: dict, container: dict, env: Environment) -> None:
    """One key for every replica, from a mounted Secret."""
    if SESSION_KEY_FILE in env.secrets:
        drift(f"{where}: {SESSION_KEY_FILE} is a path; take it from the manifests, not from a Secret")
        return
    path = env.values.get(SESSION_KEY_FILE)
    if path is None:
        drift(
            f"{where}: {SESSION_KEY_FILE} is not set: each replica would seal sessions with a key it makes up at "
            "start, so a session would work on one replica only and end at every restart"
        )
        return
    key = mounted_secret_file(rendered, where, pod, container, SESSION_KEY_FILE, path)
    if key is not None and not session_key_ok(key):
        drift(
            f"{where}: the session key ({SESSION_KEY_FILE}) is {len(key.encode('utf-8', 'surrogateescape'))} bytes; "
            "the console takes 32 bytes or 64 hexadecimal digits (openssl rand -hex 32)"
        )


def check_console_tls(rendered: Rendered, where: str, pod: dict, container: dict, env: Environment, pods: dict[str, ServicePod]) -> None:
    """The console is a TLS client only: the CA when the services serve TLS,
    its own certificate when they demand one, nothing when they are plain."""
    if "MUSTER_TLS_CLIENT_AUTH" in env.values or "MUSTER_TLS_CLIENT_AUTH" in env.secrets:
        drift(f"{where}: sets MUSTER_TLS_CLIENT_AUTH, a server's setting: the console serves plain HTTP (TLS ends at the ingress)")
    given = {variable for variable in TLS_FILES if variable in env.values or variable in env.secrets}
    for variable in sorted(given):
        if variable in env.secrets:
            drift(f"{where}: {variable} is a path; take it from the manifests, not from a Secret")
        else:
            mounted_secret_file(rendered, where, pod, container, variable, env.values[variable])
    if not any(service.tls.serves for service in pods.values()):
        if given:
            drift(f"{where}: sets {sorted(given)}, but no service serves TLS in {rendered.overlay}: its URLs are http://")
        return
    if "MUSTER_TLS_CA_FILE" not in given:
        drift(
            f"{where}: the services serve TLS but MUSTER_TLS_CA_FILE is not set: the console would check their "
            "certificates against the public web roots"
        )
    certificate = {"MUSTER_TLS_CERT_FILE", "MUSTER_TLS_KEY_FILE"}
    demanding = sorted(name for name, service in pods.items() if service.tls.mutual)
    if len(certificate & given) == 1:
        drift(f"{where}: sets {sorted(certificate & given)} without {sorted(certificate - given)}: a client certificate needs both")
    elif demanding and not certificate & given:
        drift(
            f"{where}: no client certificate (MUSTER_TLS_CERT_FILE, MUSTER_TLS_KEY_FILE), but {demanding} demand "
            "one (MUSTER_TLS_CLIENT_AUTH=required): they refuse the console's connections"
        )


def check_http_probes(where: str, container: dict, port: int, path: str) -> None:
    """The console's probes: HTTP GETs of its health path on its one port."""
    named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if probe is None:
            if probe_name != "startupProbe":
                drift(f"{where}: no {probe_name}")
            continue
        http = probe.get("httpGet")
        if http is None:
            drift(f"{where}: {probe_name} must be an httpGet probe of {path} (the console serves HTTP, not gRPC)")
            continue
        target = http.get("port")
        if (named.get(target) if isinstance(target, str) else target) != port:
            drift(f"{where}: {probe_name} probes port {target!r}, the console listens on {port}")
        if http.get("path") != path:
            drift(f"{where}: {probe_name} probes path {http.get('path')!r}; the console's health path is {path}")
        if http.get("scheme", "HTTP") != "HTTP":
            drift(f"{where}: {probe_name} uses {http['scheme']}; the console serves plain HTTP (TLS ends at the ingress)")


def check_console_exposure(rendered: Rendered, where: str, pod_labels: dict, port: int, container: dict) -> None:
    """The Service muster-console selects the pods and forwards plain HTTP to
    the console's port."""
    service = rendered.find("Service", "muster-console")
    selector = (service or {}).get("spec", {}).get("selector") or {}
    if service is None or not selector or not selects({"matchLabels": selector}, pod_labels):
        drift(f"{where}: no Service muster-console selects its pods")
        return
    named = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    for service_port in service["spec"].get("ports") or []:
        target = service_port.get("targetPort", service_port["port"])
        if (named.get(target) if isinstance(target, str) else target) != port:
            drift(f"{where}: Service muster-console port {service_port['port']} forwards to {target!r}, the console listens on {port}")
        if service_port.get("appProtocol", "http") != "http":
            drift(
                f"{where}: Service muster-console port {service_port['port']} has appProtocol "
                f"{service_port['appProtocol']!r}; the console speaks plain HTTP/1.1: http"
            )


def check_console(
    rendered: Rendered, code: Code, found: list[dict], pods: dict[str, ServicePod], service_secrets: dict[str, set[str]]
) -> ConsolePod | None:
    console = code.console
    assert console is not None
    if len(found) != 1:
        drift(f"{rendered.overlay}: {len(found)} Deployments run muster-{CONSOLE}; expected exactly 1")
        return None
    deployment = found[0]
    where = f"{rendered.overlay}: Deployment {deployment['metadata']['name']}"
    pod = deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
    if labels.get("app.kubernetes.io/name") != f"muster-{CONSOLE}" or labels.get("app.kubernetes.io/part-of") != "muster":
        drift(f"{where}: pod labels need app.kubernetes.io/name=muster-{CONSOLE} and app.kubernetes.io/part-of=muster")
    container = next(c for c in pod["containers"] if re.search(rf"(^|/)muster-{CONSOLE}(:|@|$)", c["image"]))
    env = environment(rendered, where, container)
    check_no_powers(where, pod, env, service_secrets)
    for variable in sorted((set(env.values) | set(env.secrets)) - CREDENTIAL_VARIABLES):
        if TEST_ONLY.search(variable):
            drift(f"{where}: sets {variable}, a test-only switch")
        elif variable.startswith("MUSTER_") and variable not in console.variables:
            drift(f"{where}: sets {variable}, which muster-{CONSOLE} does not read (it reads {', '.join(sorted(console.variables))})")
    check_security(where, pod, container)
    check_console_tls(rendered, where, pod, container, env, pods)
    check_session_key(rendered, where, pod, container, env)
    cookies = env.values.get(SECURE_COOKIES)
    if cookies is not None and cookies not in ("true", "false"):
        drift(f"{where}: {SECURE_COOKIES}={cookies!r}; the console takes true or false, and refuses to start otherwise")
    elif any(service.tls.serves for service in pods.values()) and cookies != "true":
        drift(
            f"{where}: TLS is on in {rendered.overlay}, so people reach the console over HTTPS (at the ingress): "
            f"set {SECURE_COOKIES}=true, or browsers may send the session cookie in clear text"
        )
    idle = env.values.get("MUSTER_CONSOLE_IDLE_MINUTES")
    if idle is not None and not idle.isdigit():
        drift(f"{where}: MUSTER_CONSOLE_IDLE_MINUTES={idle!r} is not a whole number of minutes")
    port = listen_port(where, env)
    if port is None:
        return None
    http_ports = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == "http"]
    if http_ports != [port]:
        drift(f"{where}: the container's http port is {http_ports}, MUSTER_LISTEN says {port}")
    if port != console.default_port:
        drift(f"{where}: listens on {port}, muster-{CONSOLE}'s default port (DEFAULT_PORT) is {console.default_port}")
    check_http_probes(where, container, port, console.health_path)
    check_written_paths(where, pod, container, env, console)
    check_console_exposure(rendered, where, labels, port, container)
    for target in sorted(console.calls):
        variable = f"MUSTER_{target.upper()}_URL"
        if variable not in env.values:
            drift(f"{where}: {variable} is not set; its default points at 127.0.0.1")
            continue
        resolve_url(rendered, where, variable, env.values[variable], target, pods)
    return ConsolePod(labels, port)


# --- network policies --------------------------------------------------------


def allowed(
    rendered: Rendered, destination_labels: dict, port: int, source_labels: dict, same_namespace: bool, elsewhere: str = "elsewhere"
) -> bool:
    """Whether the overlay's NetworkPolicies let a pod with `source_labels` (in
    the overlay's namespace, or in the namespace named `elsewhere`) open a TCP
    connection to `port` of a pod with `destination_labels`."""
    policies = [
        policy
        for policy in rendered.by_kind.get("NetworkPolicy", [])
        if "Ingress" in (policy["spec"].get("policyTypes") or ["Ingress"])
        and selects(policy["spec"].get("podSelector") or {}, destination_labels)
    ]
    if not policies:
        return True  # no policy isolates the pod
    labels_of_namespace = namespace_labels(rendered, same_namespace, elsewhere)
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(p.get("port") in (None, port) and p.get("protocol", "TCP") == "TCP" for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True  # a rule without peers admits every source
            for peer in peers:
                if "ipBlock" in peer:
                    continue
                namespace_selector = peer.get("namespaceSelector")
                namespace_ok = same_namespace if namespace_selector is None else selects(namespace_selector, labels_of_namespace)
                if namespace_ok and selects(peer.get("podSelector") or {}, source_labels):
                    return True
    return False


def namespace_labels(rendered: Rendered, same_namespace: bool, elsewhere: str) -> dict:
    """The labels of the overlay's namespace, or of the one named `elsewhere`."""
    if not same_namespace:
        return {"kubernetes.io/metadata.name": elsewhere}
    namespace = rendered.find("Namespace", rendered.namespace)
    labels = dict((namespace or {}).get("metadata", {}).get("labels") or {})
    labels["kubernetes.io/metadata.name"] = rendered.namespace
    return labels


def egress_policies(rendered: Rendered, source_labels: dict) -> list[dict]:
    return [
        policy
        for policy in rendered.by_kind.get("NetworkPolicy", [])
        if "Egress" in (policy["spec"].get("policyTypes") or (["Ingress", "Egress"] if policy["spec"].get("egress") else []))
        and selects(policy["spec"].get("podSelector") or {}, source_labels)
    ]


def egress_allowed(
    rendered: Rendered, source_labels: dict, destination_labels: dict | None, same_namespace: bool, elsewhere: str, port: int, protocol: str
) -> bool:
    """Whether the overlay's NetworkPolicies let a pod of the overlay with
    `source_labels` open a connection (`protocol`, `port`) to a pod with
    `destination_labels` (in the overlay's namespace or the one named
    `elsewhere`), or, with None, to an address outside the cluster (which
    only an ipBlock names)."""
    policies = egress_policies(rendered, source_labels)
    if not policies:
        return True  # no policy restricts the pod's egress
    labels_of_namespace = namespace_labels(rendered, same_namespace, elsewhere)
    for policy in policies:
        for rule in policy["spec"].get("egress") or []:
            ports = rule.get("ports")
            if ports and not any(
                p.get("protocol", "TCP") == protocol
                and (p.get("port") in (None, port) or (isinstance(p.get("port"), int) and p["port"] <= port <= p.get("endPort", p["port"])))
                for p in ports
            ):
                continue
            peers = rule.get("to")
            if not peers:
                return True  # a rule without peers admits every destination
            for peer in peers:
                if "ipBlock" in peer:
                    if destination_labels is None:
                        return True
                    continue
                if destination_labels is None:
                    continue
                namespace_selector = peer.get("namespaceSelector")
                namespace_ok = same_namespace if namespace_selector is None else selects(namespace_selector, labels_of_namespace)
                if namespace_ok and selects(peer.get("podSelector") or {}, destination_labels):
                    return True
    return False


def check_console_egress(rendered: Rendered, console: ConsolePod, pods: dict[str, ServicePod], calls: set[str], workloads: list[tuple[str, dict, list[int]]]) -> None:
    """The console reaches the services it calls on their gRPC ports, and DNS;
    nothing else (not the other services, no health port, no database,
    nothing in other namespaces or outside the cluster)."""
    if not egress_policies(rendered, console.labels):
        drift(
            f"{rendered.overlay}: network policies for muster-{CONSOLE}: its egress is not restricted; "
            f"it should reach only {sorted(f'muster-{name}' for name in calls)} and DNS"
        )
        return
    # name -> (labels or None for an outside address, same namespace, namespace, port, protocol)
    destinations: dict[str, tuple[dict | None, bool, str, int, str]] = {}
    for name, pod in pods.items():
        destinations[f"muster-{name}:{pod.port}"] = (pod.labels, True, "", pod.port, "TCP")
        if pod.health is not None:
            destinations[f"muster-{name}:{pod.health}"] = (pod.labels, True, "", pod.health, "TCP")
        destinations[f"muster-{name}'s labels in another namespace:{pod.port}"] = (pod.labels, False, "elsewhere", pod.port, "TCP")
    for name, labels, ports in workloads:
        for port in ports:
            destinations[f"{name}:{port}"] = (labels, True, "", port, "TCP")
    destinations["a pod of another namespace:443"] = (EXTERNAL_SOURCES["stranger"], False, "elsewhere", 443, "TCP")
    destinations["an address outside the cluster:443"] = (None, False, "", 443, "TCP")
    destinations["DNS"] = (CLUSTER_DNS[0], False, CLUSTER_DNS[1], 53, "UDP")
    expected = {f"muster-{name}:{pods[name].port}" for name in calls if name in pods} | {"DNS"}
    actual = {
        name
        for name, (labels, same, namespace, port, protocol) in destinations.items()
        if egress_allowed(rendered, console.labels, labels, same, namespace, port, protocol)
    }
    if actual != expected:
        extra, missing = sorted(actual - expected), sorted(expected - actual)
        drift(
            f"{rendered.overlay}: network policies for muster-{CONSOLE}'s egress: "
            + (f"allow {extra} (not an edge of the design)" if extra else "")
            + ("; " if extra and missing else "")
            + (f"block {missing} (an edge of the design)" if missing else "")
        )


def check_network(
    rendered: Rendered, pods: dict[str, ServicePod], database_users: set[str], console: ConsolePod | None, console_calls: set[str]
) -> None:
    default_deny = [
        policy
        for policy in rendered.by_kind.get("NetworkPolicy", [])
        if policy["spec"].get("podSelector") in ({}, None)
        and "Ingress" in (policy["spec"].get("policyTypes") or [])
        and not policy["spec"].get("ingress")
    ]
    if not default_deny:
        drift(f"{rendered.overlay}: no default-deny ingress NetworkPolicy (podSelector {{}}, no ingress rule)")
    sources: dict[str, tuple[dict, bool, str]] = {name: (pod.labels, True, "") for name, pod in pods.items()}
    sources.update({name: (labels, False, "elsewhere") for name, labels in EXTERNAL_SOURCES.items()})
    sources["neighbour"] = ({"app.kubernetes.io/name": "something-else"}, True, "")
    if console is not None:
        sources[CONSOLE] = (console.labels, True, "")
    sources["prometheus"] = (PROMETHEUS[0], False, PROMETHEUS[1])

    def reaching(labels: dict, port: int, but: str = "") -> set[str]:
        return {
            name
            for name, (source_labels, same, namespace) in sources.items()
            if name != but and allowed(rendered, labels, port, source_labels, same, namespace)
        }

    scraped = check_pod_monitors(rendered, pods)
    for destination, pod in pods.items():
        # The health port answers without credentials: no source of the design
        # reaches it but Prometheus where a PodMonitor scrapes it (the kubelet
        # probes from the pod's node, which policies always let through).
        expected_health = {"prometheus"} if destination in scraped else set()
        if pod.health is not None and (opened := reaching(pod.labels, pod.health, but=destination)) != expected_health:
            drift(
                f"{rendered.overlay}: network policies for muster-{destination}: the health port {pod.health} "
                f"(health and /metrics without credentials) is open to {sorted(opened)}; expected {sorted(expected_health)}"
            )
        expected = ALLOWED_SOURCES.get(destination, set()) - (set() if console else {CONSOLE})
        actual = reaching(pod.labels, pod.port, but=destination)
        if actual != expected:
            extra, missing = sorted(actual - expected), sorted(expected - actual)
            drift(
                f"{rendered.overlay}: network policies for muster-{destination}: "
                + (f"allow {extra} (not an edge of the design)" if extra else "")
                + ("; " if extra and missing else "")
                + (f"block {missing} (an edge of the design)" if missing else "")
            )
    if console is not None:
        expected = ALLOWED_SOURCES[CONSOLE]
        actual = reaching(console.labels, console.port, but=CONSOLE)
        if actual != expected:
            extra, missing = sorted(actual - expected), sorted(expected - actual)
            drift(
                f"{rendered.overlay}: network policies for muster-{CONSOLE}: "
                + (f"allow {extra} (not an edge of the design)" if extra else "")
                + ("; " if extra and missing else "")
                + (f"block {missing} (an edge of the design)" if missing else "")
            )
    # Any other workload of the overlay (the dev PostgreSQL): reached only by the
    # services that keep a database.
    workloads: list[tuple[str, dict, list[int]]] = []
    for kind in ("StatefulSet", "Deployment"):
        for workload in rendered.by_kind.get(kind, []):
            labels = workload["spec"]["template"]["metadata"].get("labels") or {}
            if any(labels == pod.labels for pod in pods.values()) or (console is not None and labels == console.labels):
                continue
            workloads.append(
                (
                    f"{kind} {workload['metadata']['name']}",
                    labels,
                    [p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"] for p in c.get("ports") or []],
                )
            )
            for container in workload["spec"]["template"]["spec"]["containers"]:
                for container_port in container.get("ports") or []:
                    actual = reaching(labels, container_port["containerPort"])
                    if actual != database_users:
                        drift(
                            f"{rendered.overlay}: {kind} {workload['metadata']['name']} port {container_port['containerPort']} "
                            f"is reachable from {sorted(actual)}; expected exactly the services with a database {sorted(database_users)}"
                        )
    if console is not None:
        check_console_egress(rendered, console, pods, console_calls, workloads)


def check_pod_monitors(rendered: Rendered, pods: dict[str, ServicePod]) -> set[str]:
    """The services a PodMonitor scrapes; each must be scraped at /metrics
    over plain HTTP on its container's health port, by name."""
    monitors = rendered.by_kind.get("PodMonitor", [])
    scraped = set()
    for name, pod in pods.items():
        selecting = [monitor for monitor in monitors if selects(monitor["spec"].get("selector"), pod.labels)]
        if not selecting:
            continue
        scraped.add(name)
        health_names = {p.get("name") for p in pod.container.get("ports") or [] if p.get("containerPort") == pod.health}
        for monitor in selecting:
            endpoints = monitor["spec"].get("podMetricsEndpoints") or []
            if not any(
                endpoint.get("port") in health_names
                and endpoint.get("path", "/metrics") == "/metrics"
                and endpoint.get("scheme", "http") == "http"
                for endpoint in endpoints
            ):
                drift(
                    f"{rendered.overlay}: PodMonitor {monitor['metadata']['name']} does not scrape muster-{name} at "
                    f"http /metrics on its health port (named {sorted(map(str, health_names))}): {endpoints}"
                )
    if monitors and scraped != set(pods):
        drift(f"{rendered.overlay}: the PodMonitors scrape {sorted(scraped)}, not every service {sorted(pods)}")
    return scraped


# --- the Dockerfile -------------------------------------------------------------


def check_dockerfile(services: dict[str, ServiceCode], console: ConsoleCode | None) -> None:
    """The Dockerfile builds and accepts every service, and the console."""
    binaries = {name: code.binaries for name, code in services.items()}
    if console is not None:
        binaries[CONSOLE] = console.binaries
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    toolchain = tomllib.loads((ROOT / "rust-toolchain.toml").read_text(encoding="utf-8"))["toolchain"]["channel"]
    for version in re.findall(r"^FROM rust:([0-9.]+)", dockerfile, re.MULTILINE):
        if version != toolchain:
            drift(f"Dockerfile: FROM rust:{version}, rust-toolchain.toml pins {toolchain}")
    case = re.search(r'case "\$\{SERVICE\}" in\s*\\\s*\n\s*([a-z |]+)\)', dockerfile)
    listed = {name.strip() for name in case.group(1).split("|")} if case else set()
    if listed != set(binaries):
        drift(f"Dockerfile: SERVICE accepts {sorted(listed)}, the images are {sorted(binaries)}")
    builds = re.findall(r"cargo build --release --locked((?:\s*\\\n|\s+-p\s+[\w-]+)+)", dockerfile)
    if not builds:
        drift("Dockerfile: no `cargo build --release --locked -p ...` found; update this script")
    for build in builds:
        packages = set(re.findall(r"-p\s+([\w-]+)", build))
        expected = {f"muster-{name}" for name in binaries}
        if packages != expected:
            drift(f"Dockerfile: cargo build builds {sorted(packages)}, the images need {sorted(expected)}")
    for name, built in binaries.items():
        if f"muster-{name}" not in built:
            where = CONSOLE if name == CONSOLE else f"services/{name}"
            drift(f"{where}: the Dockerfile copies target/release/muster-{name}, the package builds {sorted(built)}")


# --- main -----------------------------------------------------------------------


def check_overlay(rendered: Rendered, code: Code) -> None:
    services = code.services
    for document in rendered.documents:
        labels = document["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/part-of") != "muster" or not labels.get("app.kubernetes.io/name"):
            drift(
                f"{rendered.overlay}: {document['kind']} {document['metadata']['name']} needs the labels "
                "app.kubernetes.io/part-of=muster and app.kubernetes.io/name"
            )
    deployments: dict[str, list[dict]] = {}
    for deployment in rendered.by_kind.get("Deployment", []):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            image = container["image"].rsplit("/", 1)[-1].split("@")[0]
            image_name, _, tag = image.partition(":")
            match = re.fullmatch(r"muster-([a-z]+)", image_name)
            if match:
                deployments.setdefault(match.group(1), []).append(deployment)
                if match.group(1) not in services and (match.group(1) != CONSOLE or code.console is None):
                    drift(f"{rendered.overlay}: Deployment {deployment['metadata']['name']} runs image {image_name}, no such service")
                if rendered.overlay == "prod" and tag != code.version:
                    drift(f"{rendered.overlay}: image {container['image']} is not tagged with the workspace version {code.version}")
    pods: dict[str, ServicePod] = {}
    environments: dict[str, tuple[str, Environment]] = {}
    # Secret name -> the services whose pods use it: none is the console's.
    service_secrets: dict[str, set[str]] = {}
    for name, service in services.items():
        found = deployments.get(name, [])
        if len(found) != 1:
            drift(f"{rendered.overlay}: {len(found)} Deployments run muster-{name}; expected exactly 1")
            continue
        deployment = found[0]
        where = f"{rendered.overlay}: Deployment {deployment['metadata']['name']}"
        pod = deployment["spec"]["template"]["spec"]
        for secret in secrets_used(pod):
            service_secrets.setdefault(secret, set()).add(name)
        labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/name") != f"muster-{name}" or labels.get("app.kubernetes.io/part-of") != "muster":
            drift(f"{where}: pod labels need app.kubernetes.io/name=muster-{name} and app.kubernetes.io/part-of=muster")
        container = next(c for c in pod["containers"] if re.search(rf"(^|/)muster-{name}(:|@|$)", c["image"]))
        env = environment(rendered, where, container)
        for variable in sorted(set(env.values) | set(env.secrets)):
            if TEST_ONLY.search(variable):
                drift(f"{where}: sets {variable}, a test-only switch (crash failpoints, test databases)")
            elif variable.startswith("MUSTER_") and variable not in service.variables:
                drift(f"{where}: sets {variable}, which muster-{name} does not read (it reads {', '.join(sorted(service.variables))})")
        check_security(where, pod, container)
        tls = check_tls(rendered, where, pod, container, env)
        check_credentials(rendered, where, pod, container, env, tls, code)
        port = listen_port(where, env)
        if port is None:
            continue
        grpc_ports = [p for p in container.get("ports") or [] if p.get("name") == "grpc"]
        if [p["containerPort"] for p in grpc_ports] != [port]:
            drift(f"{where}: the container's grpc port is {[p['containerPort'] for p in grpc_ports]}, MUSTER_LISTEN says {port}")
        if port != service.default_port:
            drift(f"{where}: listens on {port}, muster-{name}'s default port (DEFAULT_PORT, used by the CLI and docs) is {service.default_port}")
        health = health_port(where, container, env, port)
        check_probes(where, container, port, health, tls)
        check_written_paths(where, pod, container, env, service)
        check_service_exposure(rendered, where, name, labels, port, container, tls)
        grace = int(env.values.get("MUSTER_SHUTDOWN_GRACE_SECONDS", code.grace_default))
        termination = pod.get("terminationGracePeriodSeconds", 30)
        if termination <= grace:
            drift(f"{where}: terminationGracePeriodSeconds {termination} must exceed MUSTER_SHUTDOWN_GRACE_SECONDS {grace}")
        if "MUSTER_DATABASE_URL" in service.variables:
            check_database_url(rendered, where, env)
        pods[name] = ServicePod(labels, container, port, health, tls)
        environments[name] = (where, env)

    # URLs of other services: set, pointing at their Service and port, with
    # TLS when they serve it. (A service's own URL, such as the roster's
    # MUSTER_ROSTER_URL that every service's settings include, is not read.)
    for name, (where, env) in environments.items():
        for variable in sorted(services[name].variables):
            match = re.fullmatch(r"MUSTER_([A-Z]+)_URL", variable)
            if not match or match.group(1).lower() not in services or match.group(1).lower() == name:
                continue
            target = match.group(1).lower()
            if variable not in env.values:
                drift(f"{where}: {variable} is not set; its default points at 127.0.0.1")
                continue
            resolve_url(rendered, where, variable, env.values[variable], target, pods)

    sizes = {name: env.values.get("MUSTER_MAX_MESSAGE_BYTES") for name, (_, env) in environments.items()}
    if len(set(sizes.values())) > 1:
        drift(f"{rendered.overlay}: MUSTER_MAX_MESSAGE_BYTES differs between services {sizes}: a message one sends, another may refuse")

    check_overlay_tls(rendered, pods)
    console = None
    if code.console is not None:
        console = check_console(rendered, code, deployments.get(CONSOLE, []), pods, service_secrets)
    database_users = {name for name, service in services.items() if "MUSTER_DATABASE_URL" in service.variables}
    check_network(rendered, pods, database_users, console, code.console.calls if code.console else set())


# --- the self-test ---------------------------------------------------------------


def find(documents: list[dict], kind: str, name: str) -> dict:
    return next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)


def deployment(documents: list[dict], name: str) -> dict:
    return find(documents, "Deployment", f"muster-{name}")


def pod_spec(documents: list[dict], name: str) -> dict:
    return deployment(documents, name)["spec"]["template"]["spec"]


def container(documents: list[dict], name: str) -> dict:
    return pod_spec(documents, name)["containers"][0]


def config(documents: list[dict], name: str) -> dict:
    return find(documents, "ConfigMap", container(documents, name)["envFrom"][0]["configMapRef"]["name"])["data"]


def policy(documents: list[dict], name: str) -> dict:
    return find(documents, "NetworkPolicy", name)


def mount(documents: list[dict], name: str, volume: str) -> dict:
    return next(m for m in container(documents, name)["volumeMounts"] if m["name"] == volume)


def remove_named(items: list[dict], name: str) -> None:
    items.remove(next(item for item in items if item["name"] == name))


def generated_secret(documents: list[dict], prefix: str) -> dict:
    """A Secret the overlay generates (its name carries a hash suffix)."""
    return next(d for d in documents if d["kind"] == "Secret" and d["metadata"]["name"].startswith(prefix + "-"))


def put(secret: dict, key: str, text: str) -> None:
    secret["data"][key] = base64.b64encode(text.encode()).decode()


def drop_service_secret(documents: list[dict]) -> None:
    """Every service without MUSTER_SERVICE_SECRET_FILE: fine under mutual TLS."""
    for name in ("execution", "roster", "validator", "notifier"):
        remove_named(container(documents, name)["env"], SERVICE_SECRET_FILE)
        remove_named(container(documents, name)["volumeMounts"], "service-secret")
        remove_named(pod_spec(documents, name)["volumes"], "service-secret")


def give_console(documents: list[dict], volume: str, variable: str | None, path: str) -> None:
    """Mounts the service's Secret volume `volume` (as the validator mounts
    it) into the console, and points `variable` at the file in it."""
    source = next(v for v in pod_spec(documents, "validator")["volumes"] if v["name"] == volume)
    pod_spec(documents, "console")["volumes"].append(source)
    container(documents, "console")["volumeMounts"].append(dict(mount(documents, "validator", volume)))
    if variable:
        container(documents, "console")["env"].append({"name": variable, "value": path})


def console_peer() -> dict:
    return {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster-console"}}}


# Each case: the overlay it breaks, how, and a text the report must contain
# (None: the change is allowed, and nothing at all may be reported).
SELF_TEST_CASES = {
    "a URL with the wrong port": ("dev", "Service muster-roster has no port", lambda d: config(d, "execution").update(MUSTER_ROSTER_URL="http://muster-roster:50053")),
    "a URL naming no Service": ("dev", "there is no Service", lambda d: config(d, "execution").update(MUSTER_NOTIFIER_URL="http://notifier:50054")),
    "a URL left to its default": ("dev", "MUSTER_NOTIFIER_URL is not set", lambda d: config(d, "execution").pop("MUSTER_NOTIFIER_URL")),
    "the notifier not told where the roster is": ("dev", "muster-notifier: MUSTER_ROSTER_URL is not set", lambda d: config(d, "notifier").pop("MUSTER_ROSTER_URL")),
    "a variable the service does not read": ("dev", "which muster-roster does not read", lambda d: config(d, "roster").update(MUSTER_ROSTER_TYPO="1")),
    "a test-only failpoint": ("dev", "test-only switch", lambda d: config(d, "notifier").update(MUSTER_NOTIFIER_FAILPOINT="after-commit")),
    "a probe on another port": ("dev", "livenessProbe probes port", lambda d: container(d, "notifier")["livenessProbe"]["grpc"].update(port=50053)),
    "a probe on the main port, not the health port": ("dev", "the health port (MUSTER_HEALTH_LISTEN) is 8081", lambda d: container(d, "validator")["readinessProbe"]["grpc"].update(port=50053)),
    "a health port not declared": ("dev", "the container's health port is []", lambda d: remove_named(container(d, "roster")["ports"], "health")),
    "an HTTP probe": ("dev", "native grpc probe", lambda d: container(d, "validator").update(readinessProbe={"tcpSocket": {"port": 50053}})),
    "a loopback listener": ("dev", "listens on loopback", lambda d: config(d, "roster").update(MUSTER_LISTEN="127.0.0.1:50052")),
    "no MUSTER_LISTEN": ("dev", "MUSTER_LISTEN is not set", lambda d: config(d, "validator").pop("MUSTER_LISTEN")),
    "a data directory off the volumes": ("dev", "not on a writable volume", lambda d: config(d, "notifier").update(MUSTER_DATA_DIR="/data")),
    "a literal database URL": ("dev", "is a literal", lambda d: container(d, "roster").update(env=[{"name": "MUSTER_DATABASE_URL", "value": "sqlite://x.db"}])),
    "no operators file": ("dev", "MUSTER_OPERATORS_FILE is not set", lambda d: remove_named(container(d, "execution")["env"], OPERATORS_FILE)),
    "the service secret's volume not mounted": ("dev", "MUSTER_SERVICE_SECRET_FILE=/etc/muster/service/secret is on no mounted volume", lambda d: remove_named(container(d, "validator")["volumeMounts"], "service-secret")),
    "no service secret without mutual TLS": ("dev", "refuses to start", lambda d: remove_named(container(d, "roster")["env"], SERVICE_SECRET_FILE)),
    "a writable credentials mount": ("dev", "must be mounted readOnly", lambda d: mount(d, "notifier", "operators").update(readOnly=False)),
    "a credentials subPath mount": ("dev", "never sees the Secret change", lambda d: mount(d, "roster", "operators").update(mountPath="/etc/muster/operators/operators", subPath="operators")),
    "an optional credentials volume": ("dev", "is optional", lambda d: next(v for v in pod_spec(d, "execution")["volumes"] if v["name"] == "service-secret")["secret"].update(optional=True)),
    "the service secret inline": ("dev", "MUSTER_SERVICE_SECRET is set inline", lambda d: config(d, "roster").update(MUSTER_SERVICE_SECRET="x" * 64)),
    "a malformed dev operators file": ("dev", "each line is `NAME SHA256`", lambda d: put(generated_secret(d, "muster-operators"), "operators", "dev not-a-hash\n")),
    "a short dev service secret": ("dev", "needs at least", lambda d: put(generated_secret(d, "muster-service-secret"), "secret", "too-short\n")),
    "a Secret volume readable by others": ("dev", "Secret volume service-secret has defaultMode 0o444", lambda d: next(v for v in pod_spec(d, "notifier")["volumes"] if v["name"] == "service-secret")["secret"].update(defaultMode=0o444)),
    "a Secret volume with Kubernetes' default mode": ("prod", "Secret volume tls has defaultMode 0o644", lambda d: next(v for v in pod_spec(d, "roster")["volumes"] if v["name"] == "tls")["secret"].pop("defaultMode")),
    "no fsGroup": ("dev", "fsGroup must be set", lambda d: pod_spec(d, "validator")["securityContext"].pop("fsGroup")),
    "a writable root filesystem": ("dev", "readOnlyRootFilesystem", lambda d: container(d, "execution")["securityContext"].update(readOnlyRootFilesystem=False)),
    "service links": ("dev", "enableServiceLinks", lambda d: pod_spec(d, "roster").update(enableServiceLinks=True)),
    "a grace period longer than the pod's": ("dev", "terminationGracePeriodSeconds", lambda d: config(d, "execution").update(MUSTER_SHUTDOWN_GRACE_SECONDS="60")),
    "a variable used before it is defined": ("dev", "not defined before it in env", lambda d: container(d, "execution")["env"].reverse()),
    "a headless Service that remaps its port": ("dev", "headless", lambda d: find(d, "Service", "muster-roster")["spec"]["ports"][0].update(port=50099)),
    "different message limits": ("dev", "MUSTER_MAX_MESSAGE_BYTES differs", lambda d: config(d, "notifier").update(MUSTER_MAX_MESSAGE_BYTES="1024")),
    "a missing Deployment": ("dev", "0 Deployments run muster-validator", lambda d: d.remove(deployment(d, "validator"))),
    "clients of other namespaces shut out of the validator": ("dev", "network policies for muster-validator: block ['client']", lambda d: policy(d, "muster-validator")["spec"]["ingress"][0]["from"][0].pop("namespaceSelector")),
    "the execution service let into the validator": ("dev", "network policies for muster-validator: allow ['execution']", lambda d: policy(d, "muster-validator")["spec"]["ingress"][0]["from"].append({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster-execution"}}})),
    "workers shut out of the notifier": ("dev", "block ['worker']", lambda d: policy(d, "muster-notifier")["spec"]["ingress"][0]["from"].pop()),
    "the validator shut out of the roster": ("dev", "block ['validator']", lambda d: policy(d, "muster-roster")["spec"]["ingress"][0]["from"].pop(1)),
    "the health port opened": ("dev", "the health port 8081", lambda d: policy(d, "muster-notifier")["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 8081})),
    "an unlabelled resource": ("dev", "needs the labels", lambda d: d.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stray", "namespace": "muster-dev"}, "data": {}})),
    "no default deny": ("dev", "no default-deny", lambda d: d.remove(policy(d, "muster-default-deny-ingress"))),
    "PostgreSQL open to the validator": ("dev", "StatefulSet muster-postgres", lambda d: policy(d, "muster-postgres")["spec"]["ingress"][0]["from"].append({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster-validator"}}})),
    "an http:// URL to a TLS service": ("prod", "use https://", lambda d: config(d, "execution").update(MUSTER_NOTIFIER_URL="http://muster-notifier:50054")),
    "an https:// URL to a plain service": ("dev", "use http://", lambda d: config(d, "notifier").update(MUSTER_ROSTER_URL="https://muster-roster:50052")),
    "a TLS key left out": ("prod", "but not ['MUSTER_TLS_KEY_FILE']", lambda d: remove_named(container(d, "roster")["env"], "MUSTER_TLS_KEY_FILE")),
    "the TLS Secret not mounted": ("prod", "MUSTER_TLS_CERT_FILE=/etc/muster/tls/tls.crt is on no mounted volume", lambda d: remove_named(container(d, "validator")["volumeMounts"], "tls")),
    "TLS off for one service": ("prod", "TLS is on for", lambda d: [remove_named(container(d, "notifier")["env"], v) for v in (*TLS_FILES, "MUSTER_TLS_CLIENT_AUTH")]),
    "a TLS port probed by the kubelet": ("prod", "the kubelet's gRPC probes cannot", lambda d: config(d, "execution").pop("MUSTER_HEALTH_LISTEN")),
    "h2c announced for a TLS port": ("prod", "appProtocol 'kubernetes.io/h2c'", lambda d: find(d, "Service", "muster-roster")["spec"]["ports"][0].update(appProtocol="kubernetes.io/h2c")),
    "no service secret under mutual TLS": ("prod", None, drop_service_secret),
    "PodMonitor on the gRPC port": ("prod", "does not scrape muster-roster", lambda d: find(d, "PodMonitor", "muster")["spec"]["podMetricsEndpoints"][0].update(port="grpc")),
    "health ports open to Prometheus without a PodMonitor": ("prod", "is open to ['prometheus']", lambda d: d.remove(find(d, "PodMonitor", "muster"))),
    "Prometheus admitted to the gRPC port": ("prod", "allow ['prometheus']", lambda d: policy(d, "muster-metrics")["spec"]["ingress"][0]["ports"][0].update(port=50052)),
    # The console: no powers of its own.
    "the console given the service secret": ("dev", "muster-console: sets MUSTER_SERVICE_SECRET_FILE: the console must hold no credential", lambda d: give_console(d, "service-secret", SERVICE_SECRET_FILE, "/etc/muster/service/secret")),
    "the console mounting the operators file": ("dev", "uses Secret muster-operators-", lambda d: give_console(d, "operators", None, "")),
    "the console given the operators file inline": ("dev", "sets MUSTER_OPERATORS: the console must hold no credential", lambda d: config(d, "console").update(MUSTER_OPERATORS="dev:" + "0" * 64)),
    "the console given the database URLs": ("dev", "uses Secret muster-database-", lambda d: container(d, "console")["env"].append({"name": "DATABASE", "valueFrom": {"secretKeyRef": next(v for v in container(d, "roster")["env"] if v["name"] == "MUSTER_DATABASE_URL")["valueFrom"]["secretKeyRef"]}})),
    "the console given a service's certificate": ("prod", "uses Secret muster-roster-tls (used by muster-roster)", lambda d: next(v for v in pod_spec(d, "console")["volumes"] if v["name"] == "tls")["secret"].update(secretName="muster-roster-tls")),
    "the console given the service secret under mutual TLS": ("prod", "uses Secret muster-service-secret", lambda d: give_console(d, "service-secret", None, "")),
    # The console: settings.
    "a variable the console does not read": ("dev", "which muster-console does not read", lambda d: config(d, "console").update(MUSTER_MAX_IN_FLIGHT="256")),
    "the console without a session key": ("dev", "MUSTER_CONSOLE_SESSION_KEY_FILE is not set", lambda d: remove_named(container(d, "console")["env"], SESSION_KEY_FILE)),
    "a writable session key mount": ("dev", "MUSTER_CONSOLE_SESSION_KEY_FILE: volume session-key must be mounted readOnly", lambda d: mount(d, "console", "session-key").update(readOnly=False)),
    "an optional session key": ("prod", "Secret volume session-key is optional", lambda d: next(v for v in pod_spec(d, "console")["volumes"] if v["name"] == "session-key")["secret"].update(optional=True)),
    "a short dev session key": ("dev", "the console takes 32 bytes or 64 hexadecimal digits", lambda d: put(generated_secret(d, "muster-console-session"), "key", "0123456789abcdef\n")),
    "a raw 32-byte dev session key": ("dev", None, lambda d: generated_secret(d, "muster-console-session")["data"].update(key=base64.b64encode(bytes(range(200, 232))).decode())),
    "the console's validator URL left out": ("dev", "muster-console: MUSTER_VALIDATOR_URL is not set", lambda d: config(d, "console").pop("MUSTER_VALIDATOR_URL")),
    "the console's roster URL on the notifier": ("dev", "MUSTER_ROSTER_URL=http://muster-notifier:50054: Service muster-notifier does not select the roster pods", lambda d: config(d, "console").update(MUSTER_ROSTER_URL="http://muster-notifier:50054")),
    "an http:// console URL under TLS": ("prod", "muster-console: MUSTER_EXECUTION_URL=http://muster-execution:50051: muster-execution speaks TLS only", lambda d: config(d, "console").update(MUSTER_EXECUTION_URL="http://muster-execution:50051")),
    "the console on another port": ("dev", "muster-console's default port (DEFAULT_PORT) is 50080", lambda d: config(d, "console").update(MUSTER_LISTEN="0.0.0.0:8080")),
    "a gRPC probe on the console": ("dev", "readinessProbe must be an httpGet probe of /healthz", lambda d: container(d, "console").update(readinessProbe={"grpc": {"port": 50080}})),
    "a console probe of another path": ("dev", "livenessProbe probes path '/'", lambda d: container(d, "console")["livenessProbe"]["httpGet"].update(path="/")),
    "the console's Service on another port": ("dev", "Service muster-console port 50080 forwards to 8080", lambda d: find(d, "Service", "muster-console")["spec"]["ports"][0].update(targetPort=8080)),
    "no client certificate for the console under mutual TLS": ("prod", "they refuse the console's connections", lambda d: [remove_named(container(d, "console")["env"], v) for v in ("MUSTER_TLS_CERT_FILE", "MUSTER_TLS_KEY_FILE")]),
    "no CA for the console under TLS": ("prod", "MUSTER_TLS_CA_FILE is not set", lambda d: remove_named(container(d, "console")["env"], "MUSTER_TLS_CA_FILE")),
    "client auth set on the console": ("prod", "MUSTER_TLS_CLIENT_AUTH, a server's setting", lambda d: container(d, "console")["env"].append({"name": "MUSTER_TLS_CLIENT_AUTH", "value": "required"})),
    "insecure session cookies behind TLS": ("prod", "set MUSTER_CONSOLE_SECURE_COOKIES=true", lambda d: config(d, "console").pop(SECURE_COOKIES)),
    "a session cookie setting the console refuses": ("prod", "the console takes true or false", lambda d: config(d, "console").update({SECURE_COOKIES: "yes"})),
    "service links on the console": ("dev", "muster-console: enableServiceLinks", lambda d: pod_spec(d, "console").update(enableServiceLinks=True)),
    "a missing console Deployment": ("dev", "0 Deployments run muster-console", lambda d: d.remove(deployment(d, "console"))),
    # The console: network edges.
    "the console let into the notifier": ("dev", "network policies for muster-notifier: allow ['console']", lambda d: policy(d, "muster-notifier")["spec"]["ingress"][0]["from"].append(console_peer())),
    "the console shut out of the validator": ("dev", "network policies for muster-validator: block ['console']", lambda d: policy(d, "muster-validator")["spec"]["ingress"][0]["from"].pop()),
    "the console open to every pod": ("prod", "network policies for muster-console: allow", lambda d: policy(d, "muster-console")["spec"]["ingress"][0].update({"from": [{"namespaceSelector": {}}]})),
    "the console shut out of its clients": ("dev", "network policies for muster-console: block ['client']", lambda d: policy(d, "muster-console")["spec"].pop("ingress")),
    "the console's egress unrestricted": ("dev", "its egress is not restricted", lambda d: policy(d, "muster-console")["spec"].update(policyTypes=["Ingress"], egress=[])),
    "the console's egress open to everything": ("dev", "muster-console's egress: allow", lambda d: policy(d, "muster-console")["spec"]["egress"].append({})),
    "the console's egress to the notifier": ("prod", "egress: allow ['muster-notifier:50054']", lambda d: policy(d, "muster-console")["spec"]["egress"].append({"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster-notifier"}}}], "ports": [{"protocol": "TCP", "port": 50054}]})),
    "the console's egress to a health port": ("dev", "egress: allow ['muster-execution:8081']", lambda d: policy(d, "muster-console")["spec"]["egress"][0]["ports"].append({"protocol": "TCP", "port": 8081})),
    "the console's egress to PostgreSQL": ("dev", "egress: allow ['StatefulSet muster-postgres:5432']", lambda d: policy(d, "muster-console")["spec"]["egress"].append({"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "muster-postgres"}}}], "ports": [{"protocol": "TCP", "port": 5432}]})),
    "the console's egress to any namespace": ("dev", "muster-execution's labels in another namespace:50051", lambda d: policy(d, "muster-console")["spec"]["egress"][0]["to"][0].update(namespaceSelector={})),
    "the console's DNS blocked": ("dev", "egress: block ['DNS']", lambda d: policy(d, "muster-console")["spec"]["egress"].pop()),
    "the console cut off from the roster": ("dev", "egress: block ['muster-roster:50052']", lambda d: policy(d, "muster-console")["spec"]["egress"].pop(1)),
}


def self_test(code: Code) -> int:
    """Breaks the rendered overlays in known ways and checks that each break
    is reported, so the check itself cannot silently stop checking."""
    import copy

    bases = {name: render(OVERLAYS / name) for name in ("dev", "prod")}
    passed = failed = 0
    for name, base in bases.items():
        problems.clear()
        check_overlay(base, code)
        if problems:
            failed += 1
            print(f"self-test: the unmodified {name} overlay reports {problems}", file=sys.stderr)
        else:
            passed += 1
    for description, (overlay, expected, mutate) in SELF_TEST_CASES.items():
        base = bases[overlay]
        documents = copy.deepcopy(base.documents)
        mutate(documents)
        problems.clear()
        check_overlay(Rendered(overlay, base.namespace, documents), code)
        if (not problems) if expected is None else any(expected in problem for problem in problems):
            passed += 1
        else:
            failed += 1
            wanted = "no problem" if expected is None else f"a problem containing {expected!r}"
            print(f"self-test: {description} ({overlay}): expected {wanted}, got {problems}", file=sys.stderr)
    problems.clear()
    print(f"check_manifests: {passed} passed, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    code = read_code()
    if sys.argv[1:] == ["--self-test"]:
        return self_test(code)
    if sys.argv[1:]:
        sys.exit("usage: check_manifests.py [--self-test]")
    check_dockerfile(code.services, code.console)
    overlays = sorted(path for path in OVERLAYS.iterdir() if (path / "kustomization.yaml").is_file())
    if {path.name for path in overlays} != {"dev", "prod"}:
        drift(f"k8s/overlays: expected dev and prod, found {[path.name for path in overlays]}")
    for overlay in overlays:
        check_overlay(render(overlay), code)
    if problems:
        for problem in problems:
            print(f"drift: {problem}", file=sys.stderr)
        print(f"check_manifests: {len(problems)} problem(s): the manifests no longer match the code", file=sys.stderr)
        return 1
    ports = {name: service.default_port for name, service in code.services.items()}
    if code.console is not None:
        ports[CONSOLE] = code.console.default_port
    print(
        f"check_manifests: {', '.join(o.name for o in overlays)} match the code "
        f"({', '.join(f'{n}:{p}' for n, p in ports.items())})"
    )
    return 0

if __name__ == "__main__":
    sys.exit(main())
