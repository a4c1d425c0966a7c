//! Out of file descriptors, the accept loop neither spins nor dies: it backs
//! off, and accepts the waiting client once descriptors are free again.
//! Alone in its binary because it lowers the process's descriptor limit.

mod common;

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use rustix::net::{connect, socket, AddressFamily, SocketType};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// CPU time this process has used (user + system), read from
/// /proc/self/stat opened beforehand: there will be no descriptor to open it.
fn cpu_time(stat: &mut File) -> Duration {
    let mut text = String::new();
    stat.seek(SeekFrom::Start(0)).unwrap();
    stat.read_to_string(&mut text).unwrap();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = text.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // The kernel reports in USER_HZ, 100 on Linux.
    Duration::from_millis(ticks * 10)
}

#[test]
fn the_accept_loop_backs_off_without_descriptors_and_recovers() {
    let server = TestServer::start();
    let mut bystander = RawClient::unix(&server.socket);
    bystander.connect_export(DISK, SIMPLE);
    // Served once, so its connection holds all its descriptors already.
    assert_healthy(&mut bystander, 39);

    // The client's socket and the stat file exist before the descriptors run out.
    let mut stat = File::open("/proc/self/stat").unwrap();
    let socket = socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    let saved = getrlimit(Resource::Nofile);
    setrlimit(Resource::Nofile, Rlimit { current: Some(256), maximum: saved.maximum }).unwrap();
    let mut hog = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(file) => hog.push(file),
            Err(error) if error.raw_os_error() == Some(24) => break, // EMFILE
            Err(error) => panic!("{error}"),
        }
    }
    connect(&socket, &server.address).unwrap();
    let mut waiting = TcpStream::from(socket);
    let started = cpu_time(&mut stat);
    waiting.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let error = waiting.read(&mut [0u8; 18]).expect_err("no greeting without a descriptor to accept with");
    assert!(matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut), "{error}");
    let spent = cpu_time(&mut stat) - started;
    assert!(spent < Duration::from_millis(300), "the accept loop spun: {spent:?} of CPU in one second");

    drop(hog);
    setrlimit(Resource::Nofile, saved).unwrap();
    let mut client = RawClient::from_tcp(waiting);
    client.connect_export(DISK, SIMPLE);
    assert_healthy(&mut client, 40);
    assert_healthy(&mut bystander, 41);
}
