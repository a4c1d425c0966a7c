//! The door (issue 11): API tokens, browsers kept out, the HTTP edge under a
//! crowd of idle and slow clients, HTTPS, NBD over TLS with client
//! certificates deciding access, and the refusal to expose the node without
//! them — with curl, nbdinfo and qemu-img.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{describe, json, require, run, run_failing, Server, REWIND};

/// An HTTP request with curl: the status and the body.
fn curl(args: &[&str]) -> (u16, String) {
    let output =
        Command::new("curl").args(["-s", "-o", "-", "-w", "\n%{http_code}"]).args(args).output().expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}")
}

const UNAUTHORIZED: &str =
    r#"{"error":"this API needs a valid token: send Authorization: Bearer TOKEN","kind":"unauthorized"}"#;

#[test]
fn the_api_needs_a_token_and_tokens_are_scoped() {
    require("curl");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let mode = std::fs::metadata(data.join("admin-token")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777, 0o600);
    server.rewind(&["volume", "create", "alpha", "--size", "1MiB"]);
    server.rewind(&["volume", "create", "beta", "--size", "1MiB"]);
    let api = server.api();

    // No token, a wrong one, or a malformed header: 401 and nothing else.
    for route in ["/v1/health", "/v1/volumes", "/v1/volumes/alpha", "/metrics", "/v1/tokens", "/nosuch"] {
        let url = format!("{api}{route}");
        // (The data directory tells whose answer it was, should another server answer.)
        assert_eq!(curl(&[&url]), (401, UNAUTHORIZED.to_owned()), "{route} on the server of {}", data.display());
        // The token with its last character changed (to one it is not).
        let (kept, last) = server.token.split_at(server.token.len() - 1);
        let wrong = bearer(&format!("{kept}{}", if last == "0" { '1' } else { '0' }));
        assert_eq!(curl(&["-H", &wrong, &url]), (401, UNAUTHORIZED.to_owned()), "{route}");
        assert_eq!(curl(&["-H", "Authorization: Basic YWRtaW46YWRtaW4=", &url]).0, 401, "{route}");
    }
    let delete = curl(&["-X", "DELETE", &format!("{api}/v1/volumes/alpha")]);
    assert_eq!(delete.0, 401);
    let admin = bearer(&server.token);
    assert_eq!(curl(&["-H", &admin, &format!("{api}/v1/health")]).0, 200);
    assert_eq!(curl(&["-H", &admin, &format!("{api}/metrics")]).0, 200);

    // A read-only token reads and may not change anything.
    let read_only = json(&server.rewind(&["token", "create", "--read-only", "--name", "dashboard", "--json"]));
    let read_only_token = read_only["token"].as_str().unwrap().to_owned();
    let (status, body) = curl(&["-H", &bearer(&read_only_token), &format!("{api}/v1/volumes")]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body).as_array().unwrap().len(), 2);
    let create =
        ["-X", "POST", "-H", "Content-Type: application/json", "-d", r#"{"name":"gamma","size_bytes":1048576}"#];
    let (status, body) =
        curl(&[&create[..], &["-H", &bearer(&read_only_token), &format!("{api}/v1/volumes")]].concat());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("read-only"), "{body}");
    let output = Command::new(REWIND)
        .args(["volume", "create", "gamma", "--size", "1MiB", "--server", &api])
        .env("REWIND_TOKEN", &read_only_token)
        .output()
        .unwrap();
    assert!(!output.status.success() && String::from_utf8_lossy(&output.stderr).contains("read-only"));

    // A token for one volume sees only it; the others look absent.
    let scoped = json(&server.rewind(&["token", "create", "--volume", "alpha", "--json"]));
    let scoped = bearer(scoped["token"].as_str().unwrap());
    let (_, body) = curl(&["-H", &scoped, &format!("{api}/v1/volumes")]);
    let names: Vec<_> = json(&body).as_array().unwrap().iter().map(|volume| volume["name"].clone()).collect();
    assert_eq!(names, ["alpha"]);
    let (status, absent) = curl(&["-H", &scoped, &format!("{api}/v1/volumes/beta")]);
    let (_, missing) = curl(&["-H", &admin, &format!("{api}/v1/volumes/nosuch")]);
    assert_eq!(status, 404);
    assert_eq!(absent.replace("beta", "NAME"), missing.replace("nosuch", "NAME"), "as if it did not exist");
    assert_eq!(curl(&["-H", &scoped, &format!("{api}/v1/volumes/alpha/timeline")]).0, 200);
    let bookmark = ["-X", "POST", "-H", "Content-Type: application/json", "-d", r#"{"name":"mark"}"#];
    let url = format!("{api}/v1/volumes/alpha/bookmarks");
    assert_eq!(curl(&[&bookmark[..], &["-H", &scoped, &url]].concat()).0, 201);
    let url = format!("{api}/v1/volumes/beta/bookmarks");
    assert_eq!(curl(&[&bookmark[..], &["-H", &scoped, &url]].concat()).0, 404);
    for node_wide in ["/v1/stats", "/metrics", "/v1/tokens", "/v1/access"] {
        assert_eq!(curl(&["-H", &scoped, &format!("{api}{node_wide}")]).0, 403, "{node_wide}");
    }

    // Revoked is gone at once; the list never shows a token itself.
    let list = server.rewind(&["token", "list"]);
    assert!(list.contains("dashboard") && list.contains("admin") && !list.contains(&read_only_token), "{list}");
    server.rewind(&["token", "revoke", read_only["id"].as_str().unwrap()]);
    assert_eq!(curl(&["-H", &bearer(&read_only_token), &format!("{api}/v1/volumes")]).0, 401);

    // Offline, on the data directory: the same commands.
    server.stop();
    let offline = |args: &[&str]| run(REWIND, &[args, &["--offline", "--data-dir", data.to_str().unwrap()]].concat());
    let created = json(&offline(&["token", "create", "--name", "made-offline", "--json"]));
    assert!(offline(&["token", "list"]).contains("made-offline"));
    offline(&["access", "grant", "alpha", "alice", "--read-only"]);
    assert!(offline(&["access", "list"]).contains("read-only"));
    let server = Server::start(&data);
    let made_offline = bearer(created["token"].as_str().unwrap());
    assert_eq!(curl(&["-H", &made_offline, &format!("{}/v1/volumes", server.api())]).0, 200);
    assert!(server.rewind(&["access", "list", "--json"]).contains("alice"));
}

#[test]
fn browsers_cannot_change_anything_nor_rebind_the_name() {
    require("curl");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(&dir.path().join("data"), &["--http-allowed-host", "rewind.example"]);
    let api = server.api();
    let admin = bearer(&server.token);
    let volumes = format!("{api}/v1/volumes");
    let body = r#"{"name":"csrf","size_bytes":1048576}"#;

    // What a page on another origin can send without a preflight: a form or
    // text/plain. Refused, even carrying a valid token.
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"] {
        let (status, answer) = curl(&[
            "-X",
            "POST",
            "-H",
            &admin,
            "-H",
            "Origin: http://evil.example",
            "-H",
            &format!("Content-Type: {content_type}"),
            "-d",
            body,
            &volumes,
        ]);
        assert_eq!(status, 415, "{content_type}: {answer}");
    }
    // Another origin with a JSON body (a page cannot send that without a
    // preflight, but a leaked token should not make it work either).
    let json_post = ["-X", "POST", "-H", "Content-Type: application/json", "-d", body];
    let (status, _) = curl(&[&json_post[..], &["-H", &admin, "-H", "Origin: http://evil.example", &volumes]].concat());
    assert_eq!(status, 403);
    let (status, _) = curl(&[&json_post[..], &["-H", &admin, "-H", "Sec-Fetch-Site: cross-site", &volumes]].concat());
    assert_eq!(status, 403);
    assert!(!server.rewind(&["volume", "list"]).contains("csrf"), "nothing was created");

    // DNS rebinding: a name that resolves to us but is not ours.
    let (status, answer) = curl(&["-H", &admin, "-H", "Host: evil.example", &volumes]);
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("--http-allowed-host"), "{answer}");
    let (status, _) = curl(&["-H", &admin, "-H", "Host: evil.example:8080", &format!("{api}/v1/health")]);
    assert_eq!(status, 403);
    assert_eq!(curl(&["-H", &admin, "-H", "Host: rewind.example", &volumes]).0, 200);
    assert_eq!(curl(&["-H", &admin, "-H", &format!("Host: localhost:{}", server.http.port()), &volumes]).0, 200);

    // Our own origin may.
    let own = format!("Origin: {api}");
    let (status, answer) = curl(&[&json_post[..], &["-H", &admin, "-H", &own, &volumes]].concat());
    assert_eq!(status, 201, "{answer}");
}

/// Opens `count` connections to `address` that send `prefix` (maybe
/// nothing) and then nothing more.
fn idle_connections(address: SocketAddr, count: usize, prefix: &[u8]) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut stream = TcpStream::connect(address).expect("connect");
            stream.write_all(prefix).unwrap();
            stream
        })
        .collect()
}

#[test]
fn idle_and_half_sent_api_connections_cannot_starve_the_node() {
    require("curl");
    require("nbdinfo");
    require("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    // 256 descriptors for the whole server, as on a small machine; the API
    // may hold 64 connections. The header timeout is long so that only the
    // connection limit can save the day here.
    let server = Server::start_with_open_files_max(
        &dir.path().join("data"),
        &["--http-connections-max", "64", "--http-header-timeout", "10m"],
        256,
    );
    server.rewind(&["volume", "create", "w", "--size", "8MiB"]);
    run("qemu-io", &["-f", "raw", "-c", "write -P 1 0 1M", "-c", "flush", &server.uri("w")]);

    // More idle connections than the server has descriptors, and more that
    // stop in the middle of their header.
    let mut crowd = idle_connections(server.http, 300, b"");
    let half = format!("GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n{}", "Authorization: Bea");
    crowd.extend(idle_connections(server.http, 100, half.as_bytes()));

    // A real client still gets in, the volume keeps working and is not
    // poisoned, and NBD still accepts.
    let (status, body) = curl(&["-m", "30", "-H", &bearer(&server.token), &format!("{}/v1/health", server.api())]);
    assert_eq!(status, 200, "{body}");
    run("qemu-io", &["-f", "raw", "-c", "write -P 2 1M 1M", "-c", "flush", &server.uri("w")]);
    run("qemu-io", &["-f", "raw", "-r", "-c", "read -P 1 0 1M", "-c", "read -P 2 1M 1M", &server.uri("w")]);
    let info = run("nbdinfo", &[&server.uri("w")]);
    assert!(info.contains("export-size: 8388608"), "{info}");
    let volumes: serde_json::Value = json(&server.rewind(&["volume", "list", "--json"]));
    assert_eq!(volumes[0]["poisoned"], false, "{volumes}");
    // The crowd's connections were closed to make room: the oldest first.
    let mut closed = 0;
    for stream in &mut crowd[..100] {
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        if matches!(stream.read(&mut [0u8; 64]), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(closed, 100, "the longest idle connections were closed");
    drop(crowd);
}

/// Reads until end-of-file; returns what came and how long it took.
fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    stream.set_read_timeout(Some(limit)).unwrap();
    let started = Instant::now();
    let mut received = Vec::new();
    loop {
        let mut buffer = [0u8; 4096];
        match stream.read(&mut buffer) {
            Ok(0) => return (received, started.elapsed()),
            Ok(count) => received.extend_from_slice(&buffer[..count]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return (received, started.elapsed()),
            Err(error) => panic!("the server kept the connection past {limit:?}: {error}"),
        }
    }
}

#[test]
fn stalled_headers_and_bodies_are_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(&dir.path().join("data"), &["--http-header-timeout", "1s", "--http-body-timeout", "1s"]);

    // Half a header, then nothing: closed after the header timeout.
    let mut half = TcpStream::connect(server.http).unwrap();
    half.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let (_, waited) = read_to_close(&mut half, Duration::from_secs(30));
    assert!(waited < Duration::from_secs(20), "closed after {waited:?}");

    // An import that stops sending: the request fails once the body has
    // stalled for the body timeout, and nothing is left behind.
    let mut import = TcpStream::connect(server.http).unwrap();
    let head = format!(
        "POST /v1/volumes/stalled/import HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: 1048576\r\n\r\n",
        server.token
    );
    import.write_all(head.as_bytes()).unwrap();
    import.write_all(&[7u8; 65536]).unwrap();
    let (answer, waited) = read_to_close(&mut import, Duration::from_secs(30));
    let answer = String::from_utf8_lossy(&answer);
    assert!(waited < Duration::from_secs(20), "closed after {waited:?}");
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer}");
    assert!(!server.rewind(&["volume", "list"]).contains("stalled"), "a failed import leaves nothing");
}

/// Sends one NBD option on a fresh plaintext connection and returns the
/// reply type and its message; the connection is returned for more.
fn plain_option(address: SocketAddr, option: u32) -> (TcpStream, u32, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut greeting = [0u8; 18];
    stream.read_exact(&mut greeting).unwrap();
    stream.write_all(&3u32.to_be_bytes()).unwrap(); // FIXED_NEWSTYLE | NO_ZEROES
    let mut request = Vec::new();
    request.extend_from_slice(b"IHAVEOPT");
    request.extend_from_slice(&option.to_be_bytes());
    request.extend_from_slice(&0u32.to_be_bytes());
    stream.write_all(&request).unwrap();
    let mut header = [0u8; 20];
    stream.read_exact(&mut header).unwrap();
    let reply = u32::from_be_bytes(header[12..16].try_into().unwrap());
    let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
    let mut message = vec![0u8; length as usize];
    stream.read_exact(&mut message).unwrap();
    (stream, reply, String::from_utf8_lossy(&message).into_owned())
}

fn nbds(server: &Server, export: &str, client: &Path) -> String {
    format!("nbds://{}/{export}?tls-certificates={}", server.nbd, client.display())
}

/// qemu's options for an NBD export over TLS with the client's certificates.
fn qemu_tls(server: &Server, export: &str, client: &Path) -> [String; 2] {
    [
        format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", client.display()),
        format!("driver=nbd,host=127.0.0.1,port={},export={export},tls-creds=tls0", server.nbd.port()),
    ]
}

#[test]
fn nbd_over_tls_with_client_certificates_decides_who_opens_what() {
    for tool in ["nbdinfo", "qemu-img", "qemu-io"] {
        require(tool);
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"), "Rewind test CA");
    let (cert, key) = pki.server();
    let ca = pki.ca_cert();
    let alice = pki.client("alice", &ca);
    let bob = pki.client("bob", &ca);
    let carol = pki.client("carol", &ca);
    let strangers = Pki::new(&dir.path().join("strangers"), "Someone else's CA");
    let mallory = strangers.client("alice", &ca);
    let (cert, key, ca_text) = (cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap());
    let mut server = Server::start_with(
        &dir.path().join("data"),
        &["--tls-cert", cert, "--tls-key", key, "--tls-verify-peer", "--tls-ca", ca_text],
    );
    server.server_ca = Some(ca.clone());
    server.rewind(&["volume", "create", "db", "--size", "4MiB"]);
    server.rewind(&["volume", "create", "secret", "--size", "4MiB"]);
    server.rewind(&["bookmark", "db", "empty"]);
    server.rewind(&["access", "grant", "db", "alice"]);
    server.rewind(&["access", "grant", "db", "bob", "--read-only"]);

    // TLS is required: plain NBD is refused, and the client is told why.
    let plain = run_failing("nbdinfo", &[&server.uri("db")]);
    assert!(!plain.contains("export-size"), "{plain}");
    let (mut stream, reply, message) = plain_option(server.nbd, 3); // NBD_OPT_LIST
    assert_eq!(reply, 0x8000_0005, "NBD_REP_ERR_TLS_REQD: {message}");
    assert!(message.contains("requires TLS"), "{message}");
    // NBD_OPT_EXPORT_NAME cannot be refused with an error: the server hangs up.
    let mut export_name = b"IHAVEOPT".to_vec();
    export_name.extend_from_slice(&1u32.to_be_bytes());
    export_name.extend_from_slice(&2u32.to_be_bytes());
    export_name.extend_from_slice(b"db");
    stream.write_all(&export_name).unwrap();
    assert_eq!(stream.read(&mut [0u8; 16]).unwrap(), 0, "hung up");

    // alice may read and write db; she sees db and its bookmark, not secret.
    let info = run("nbdinfo", &[&nbds(&server, "db", &alice)]);
    assert!(info.contains("with TLS") && info.contains("is_read_only: false"), "{info}");
    let list = run("nbdinfo", &["--list", &nbds(&server, "", &alice)]);
    assert!(list.contains("export=\"db\"") && list.contains("db@empty"), "{list}");
    assert!(!list.contains("secret"), "{list}");
    let image = dir.path().join("image.raw");
    std::fs::write(&image, common::pattern(7, 4 << 20)).unwrap();
    let [object, target] = qemu_tls(&server, "db", &alice);
    let image_text = image.to_str().unwrap();
    run("qemu-img", &["convert", "-n", "-f", "raw", "--object", &object, image_text, "--target-image-opts", &target]);
    let file = format!("driver=file,filename={image_text}");
    let compared = run("qemu-img", &["compare", "--object", &object, "--image-opts", &file, &target]);
    assert!(compared.contains("identical"), "{compared}");
    let refused = run_failing("nbdinfo", &[&nbds(&server, "secret", &alice)]);
    assert!(!refused.contains("export-size"), "{refused}");

    // bob's grant is read-only: the live volume opens read-only for him.
    let info = run("nbdinfo", &[&nbds(&server, "db", &bob)]);
    assert!(info.contains("is_read_only: true"), "{info}");
    let [object, target] = qemu_tls(&server, "db", &bob);
    let compared = run("qemu-img", &["compare", "--object", &object, "--image-opts", &file, &target]);
    assert!(compared.contains("identical"), "bob reads what alice wrote: {compared}");
    let write = Command::new("qemu-io")
        .args(["--object", &object, "--image-opts", &target, "-c", "write -P 9 0 4k"])
        .output()
        .unwrap();
    let written = String::from_utf8_lossy(&write.stdout).into_owned() + &String::from_utf8_lossy(&write.stderr);
    assert!(!written.contains("wrote 4096"), "bob wrote: {}", describe(&write));

    // carol has a valid certificate and no grant: nothing to see.
    let list = run("nbdinfo", &["--list", &nbds(&server, "", &carol)]);
    assert!(!list.contains("db") && !list.contains("secret"), "{list}");
    run_failing("nbdinfo", &[&nbds(&server, "db", &carol)]);
    // A certificate from another CA, even named alice, does not get in.
    run_failing("nbdinfo", &[&nbds(&server, "db", &mallory)]);

    // A grant to anyone; a revoked grant is gone for the next connection.
    server.rewind(&["access", "grant", "secret", "*", "--read-only"]);
    assert!(run("nbdinfo", &[&nbds(&server, "secret", &carol)]).contains("is_read_only: true"));
    server.rewind(&["access", "revoke", "db", "alice"]);
    run_failing("nbdinfo", &[&nbds(&server, "db", &alice)]);
    server.stop();
}

#[test]
fn https_for_the_api_and_no_exposure_without_tls() {
    require("curl");
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"), "Rewind test CA");
    let (cert, key) = pki.server();
    let ca = pki.ca_cert();
    let (cert, key, ca_text) = (cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap());
    let data = dir.path().join("data");
    let data_text = data.to_str().unwrap();

    // Binding beyond loopback needs TLS, or --insecure; the error says what to add.
    let serve = |extra: &[&str]| run_failing(REWIND, &[&["serve", "--data-dir", data_text][..], extra].concat());
    let error = serve(&["--http", "0.0.0.0:0", "--nbd", "127.0.0.1:0"]);
    assert!(error.contains("--tls-cert FILE --tls-key FILE") && error.contains("--insecure"), "{error}");
    let error = serve(&["--http", "127.0.0.1:0", "--nbd", "0.0.0.0:0"]);
    assert!(error.contains("--tls require") && error.contains("--tls-verify-peer --tls-ca FILE"), "{error}");
    let error = serve(&["--http", "127.0.0.1:0", "--nbd", "0.0.0.0:0", "--tls-cert", cert, "--tls-key", key]);
    assert!(error.contains("--tls-verify-peer --tls-ca FILE") && !error.contains("--tls-cert FILE"), "{error}");
    let error = serve(&["--tls-psk", "keys.psk"]);
    assert!(error.contains("not supported") && error.contains("rustls"), "{error}");
    assert!(!data.join("volumes").exists(), "nothing was started");

    // HTTPS with the same certificate NBD uses.
    let mut server = Server::start_with(&data, &["--tls-cert", cert, "--tls-key", key, "--tls", "on"]);
    assert!(server.https);
    server.server_ca = Some(ca.clone());
    let health = format!("{}/v1/health", server.api());
    let (status, body) = curl(&["--cacert", ca_text, "-H", &bearer(&server.token), &health]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(curl(&["--cacert", ca_text, &health]), (401, UNAUTHORIZED.to_owned()));
    let plain = format!("http://{}/v1/health", server.http);
    assert_ne!(curl(&["-m", "10", "-H", &bearer(&server.token), &plain]).0, 200, "no plain HTTP");
    server.rewind(&["volume", "create", "db", "--size", "1MiB"]);
    assert!(server.rewind(&["volume", "list"]).contains("db"));
    // --tls on: plain NBD from this machine still works.
    assert!(run("nbdinfo", &[&server.uri("db")]).contains("export-size: 1048576"));
    server.stop();
}
