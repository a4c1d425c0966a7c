//! Clients that break the protocol, over raw TCP and Unix sockets. Each test
//! checks the server's answer (the spec's error, or a closed connection), that
//! a well-behaved client connected at the same time is still served
//! correctly, and that the export holds what it must.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rewind_nbd::protocol as p;
use rewind_nbd::ServerConfig;

/// Starts a server plus a well-behaved client already in transmission on
/// `disk` over the Unix socket (the misbehaving one uses TCP).
fn server_and_bystander() -> (TestServer, RawClient) {
    let server = TestServer::start();
    let mut bystander = RawClient::unix(&server.socket);
    bystander.connect_export(DISK, SIMPLE);
    assert_healthy(&mut bystander, 1);
    (server, bystander)
}

#[test]
fn unknown_client_flags_close_the_connection() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE | 1 << 7);
    client.expect_closed();
    assert_healthy(&mut bystander, 2);
}

#[test]
fn bad_option_magic_closes_the_connection() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    let mut message = b"IHAVEOPX".to_vec();
    message.extend_from_slice(&p::OPT_LIST.to_be_bytes());
    message.extend_from_slice(&0u32.to_be_bytes());
    client.send(&message);
    client.expect_closed();
    assert_healthy(&mut bystander, 3);
}

#[test]
fn absurd_option_lengths_close_the_connection_without_reading_the_data() {
    let (server, mut bystander) = server_and_bystander();
    for length in [u32::MAX, p::OPTION_BYTES_MAX + 1] {
        let mut client = RawClient::tcp(server.address);
        client.start(p::FLAG_C_FIXED_NEWSTYLE);
        let mut message = b"IHAVEOPT".to_vec();
        message.extend_from_slice(&p::OPT_GO.to_be_bytes());
        message.extend_from_slice(&length.to_be_bytes());
        client.send(&message);
        // No data follows: the server must hang up rather than wait for it.
        client.expect_closed();
    }
    assert_healthy(&mut bystander, 4);
}

#[test]
fn unknown_options_get_unsup_and_negotiation_continues() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    for option in [0x1234, p::OPT_PEEK_EXPORT, p::OPT_EXTENDED_HEADERS, u32::MAX] {
        let replies = client.option(option, b"some data the server must skip");
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].reply_type, p::REP_ERR_UNSUP);
    }
    let replies = client.option(p::OPT_GO, &info_data(DISK, &[]));
    assert_eq!(replies.last().unwrap().reply_type, p::REP_ACK);
    assert_healthy(&mut client, 5);
    assert_healthy(&mut bystander, 6);
}

#[test]
fn malformed_options_get_invalid_with_a_message() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    let mut lying_name = info_data(DISK, &[]);
    lying_name[0..4].copy_from_slice(&1000u32.to_be_bytes());
    let cases: Vec<(u32, Vec<u8>)> = vec![
        (p::OPT_LIST, b"x".to_vec()),
        (p::OPT_STRUCTURED_REPLY, b"x".to_vec()),
        (p::OPT_STARTTLS, b"x".to_vec()),
        (p::OPT_GO, vec![0, 0]),
        (p::OPT_GO, lying_name),
        (p::OPT_INFO, info_data("bad\0name", &[])),
        (p::OPT_INFO, vec![0, 0, 0, 2, 0xff, 0xfe, 0, 0]),
        // Meta contexts need structured replies first.
        (p::OPT_SET_META_CONTEXT, meta_data(DISK, &[p::META_BASE_ALLOCATION])),
    ];
    for (option, data) in cases {
        let replies = client.option(option, &data);
        assert_eq!(replies.len(), 1, "{replies:?}");
        assert_eq!(replies[0].reply_type, p::REP_ERR_INVALID, "option {option}: {replies:?}");
        assert!(!replies[0].data.is_empty(), "error replies carry a message");
    }
    assert_eq!(client.option(p::OPT_STRUCTURED_REPLY, &[])[0].reply_type, p::REP_ACK);
    for data in [meta_data(DISK, &["allocation"]), meta_data(DISK, &[":x"]), vec![0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0]] {
        let replies = client.option(p::OPT_LIST_META_CONTEXT, &data);
        assert_eq!(replies[0].reply_type, p::REP_ERR_INVALID, "{replies:?}");
    }
    let replies = client.option(p::OPT_GO, &info_data(DISK, &[]));
    assert_eq!(replies.last().unwrap().reply_type, p::REP_ACK);
    assert_healthy(&mut bystander, 7);
}

#[test]
fn starttls_is_declined_by_policy() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    let replies = client.option(p::OPT_STARTTLS, &[]);
    assert_eq!(replies[0].reply_type, p::REP_ERR_POLICY);
    assert!(String::from_utf8_lossy(&replies[0].data).contains("TLS"));
    go_and_check(&mut client, DISK);
}

/// GO on a connection whose handshake already started, then a sanity check.
fn go_and_check(client: &mut RawClient, name: &str) {
    let replies = client.option(p::OPT_GO, &info_data(name, &[]));
    assert_eq!(replies.last().unwrap().reply_type, p::REP_ACK, "{replies:?}");
    assert_healthy(client, 9);
}

#[test]
fn export_name_for_a_missing_export_closes_the_connection() {
    let (server, mut bystander) = server_and_bystander();
    for name in ["missing", TOO_OLD] {
        let mut client = RawClient::tcp(server.address);
        client.start(p::FLAG_C_FIXED_NEWSTYLE);
        client.send_option(p::OPT_EXPORT_NAME, name.as_bytes());
        client.expect_closed();
    }
    assert_healthy(&mut bystander, 10);
}

#[test]
fn go_for_a_missing_export_reports_the_catalog_message_and_allows_retry() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    for option in [p::OPT_INFO, p::OPT_GO] {
        let replies = client.option(option, &info_data(TOO_OLD, &[p::INFO_NAME]));
        assert_eq!(replies.len(), 1, "no NBD_REP_INFO before an error: {replies:?}");
        assert_eq!(replies[0].reply_type, p::REP_ERR_UNKNOWN);
        assert_eq!(String::from_utf8(replies[0].data.clone()).unwrap(), TOO_OLD_MESSAGE);
    }
    let replies = client.option(p::OPT_GO, &info_data("missing", &[]));
    assert_eq!(replies[0].reply_type, p::REP_ERR_UNKNOWN);
    assert_eq!(String::from_utf8_lossy(&replies[0].data), "no export named 'missing'");
    go_and_check(&mut client, DISK);
    assert_healthy(&mut bystander, 11);
}

#[test]
fn info_replies_honour_the_requested_information() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);

    let replies = client.option(p::OPT_INFO, &info_data(READ_ONLY, &[]));
    let types: Vec<u16> =
        replies[..replies.len() - 1].iter().map(|r| u16::from_be_bytes([r.data[0], r.data[1]])).collect();
    assert_eq!(types, vec![p::INFO_EXPORT], "only NBD_INFO_EXPORT unless asked");

    let asked = [p::INFO_BLOCK_SIZE, p::INFO_NAME, p::INFO_DESCRIPTION, 0x7777];
    let replies = client.option(p::OPT_INFO, &info_data(READ_ONLY, &asked));
    assert_eq!(replies.last().unwrap().reply_type, p::REP_ACK);
    let info = |kind: u16| {
        replies
            .iter()
            .find(|r| r.reply_type == p::REP_INFO && u16::from_be_bytes([r.data[0], r.data[1]]) == kind)
            .unwrap_or_else(|| panic!("info {kind} missing from {replies:?}"))
            .data[2..]
            .to_vec()
    };
    let export = info(p::INFO_EXPORT);
    assert_eq!(u64::from_be_bytes(export[0..8].try_into().unwrap()), READ_ONLY_BYTES as u64);
    let flags = u16::from_be_bytes(export[8..10].try_into().unwrap());
    assert_eq!(flags & p::FLAG_READ_ONLY, p::FLAG_READ_ONLY);
    assert_eq!(flags & (p::FLAG_SEND_WRITE_ZEROES | p::FLAG_SEND_TRIM | p::FLAG_SEND_FUA), 0);
    assert_eq!(flags & p::FLAG_CAN_MULTI_CONN, p::FLAG_CAN_MULTI_CONN);
    assert_eq!(info(p::INFO_NAME), READ_ONLY.as_bytes());
    assert_eq!(info(p::INFO_DESCRIPTION), b"frozen view");
    let sizes = info(p::INFO_BLOCK_SIZE);
    let sizes: Vec<u32> = sizes.chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
    assert_eq!(sizes, vec![1, 4096, p::PAYLOAD_BYTES_MAX]);
    assert_eq!(replies.len(), 5, "one reply per known info type plus ACK");
}

#[test]
fn list_and_meta_context_queries() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);

    let replies = client.option(p::OPT_LIST, &[]);
    let names: Vec<String> = replies[..replies.len() - 1]
        .iter()
        .map(|r| {
            assert_eq!(r.reply_type, p::REP_SERVER);
            let length = u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as usize;
            String::from_utf8(r.data[4..4 + length].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, vec![DISK, READ_ONLY, SPARSE]);

    assert_eq!(client.option(p::OPT_STRUCTURED_REPLY, &[])[0].reply_type, p::REP_ACK);
    let contexts = |client: &mut RawClient, option, queries: &[&str]| -> Vec<(u32, String)> {
        let replies = client.option(option, &meta_data(SPARSE, queries));
        assert_eq!(replies.last().unwrap().reply_type, p::REP_ACK, "{replies:?}");
        replies[..replies.len() - 1]
            .iter()
            .map(|r| {
                assert_eq!(r.reply_type, p::REP_META_CONTEXT);
                let id = u32::from_be_bytes(r.data[0..4].try_into().unwrap());
                (id, String::from_utf8(r.data[4..].to_vec()).unwrap())
            })
            .collect()
    };
    let base = |id| vec![(id, p::META_BASE_ALLOCATION.to_owned())];
    let list = p::OPT_LIST_META_CONTEXT;
    let set = p::OPT_SET_META_CONTEXT;
    let since_start = format!("{}{SINCE_START}", p::META_DIRTY_BITMAP_PREFIX);
    let everything = vec![(0, p::META_BASE_ALLOCATION.to_owned()), (0, since_start.clone())];
    assert_eq!(contexts(&mut client, list, &[]), everything, "no query lists everything");
    assert_eq!(contexts(&mut client, list, &["qemu:"]), vec![(0, since_start.clone())], "qemu: is a wildcard");
    assert_eq!(contexts(&mut client, list, &["qemu:dirty-bitmap:"]), vec![(0, since_start.clone())]);
    assert_eq!(contexts(&mut client, set, &["qemu:"]), vec![], "qemu: selects nothing");
    assert_eq!(contexts(&mut client, list, &["base:"]), base(0), "base: is a wildcard");
    assert_eq!(contexts(&mut client, list, &["base:allocation", "base:allocation"]), base(0));
    assert_eq!(contexts(&mut client, list, &["x-foo:bar", "qemu:dirty-bitmap:a"]), vec![]);
    assert_eq!(contexts(&mut client, list, &["base:nothing"]), vec![]);
    assert_eq!(contexts(&mut client, set, &["base:"]), vec![], "base: selects nothing");
    assert_eq!(contexts(&mut client, set, &[]), vec![]);
    assert_eq!(contexts(&mut client, set, &["x-foo:bar", p::META_BASE_ALLOCATION]), base(p::META_BASE_ALLOCATION_ID));
}

/// A SET of base:allocation and dirty bitmaps: ids in order, unknown
/// bitmaps ignored, at most `DIRTY_BITMAPS_MAX`; BLOCK_STATUS then answers
/// with one chunk per context, the last one done.
#[test]
fn block_status_answers_every_selected_context_in_one_chunk_each() {
    let server = TestServer::start();
    server.export(SPARSE).set_contents(8192, &[1; 4096]);
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(client.option(p::OPT_STRUCTURED_REPLY, &[])[0].reply_type, p::REP_ACK);
    // Ten bitmaps and a duplicate: eight are looked up and selected, the
    // rest not even looked up.
    let mut queries = vec![p::META_BASE_ALLOCATION.to_owned()];
    queries.extend((0..10).map(|i| format!("{}since-{i}", p::META_DIRTY_BITMAP_PREFIX)));
    queries.insert(2, queries[1].clone());
    let queries: Vec<&str> = queries.iter().map(String::as_str).collect();
    let replies = client.option(p::OPT_SET_META_CONTEXT, &meta_data(SPARSE, &queries));
    let selected: Vec<(u32, String)> = replies[..replies.len() - 1]
        .iter()
        .map(|r| {
            (u32::from_be_bytes(r.data[0..4].try_into().unwrap()), String::from_utf8(r.data[4..].to_vec()).unwrap())
        })
        .collect();
    let mut expected = vec![(p::META_BASE_ALLOCATION_ID, p::META_BASE_ALLOCATION.to_owned())];
    expected.extend(
        (0..p::DIRTY_BITMAPS_MAX)
            .map(|i| (p::META_DIRTY_BITMAP_FIRST_ID + i as u32, format!("{}since-{i}", p::META_DIRTY_BITMAP_PREFIX))),
    );
    assert_eq!(selected, expected);
    assert_eq!(client.option(p::OPT_GO, &info_data(SPARSE, &[])).last().unwrap().reply_type, p::REP_ACK);

    for (flags, length, allocation, dirty) in [
        (
            0,
            65536,
            vec![(8192, p::STATE_HOLE | p::STATE_ZERO), (4096, 0), (53248, p::STATE_HOLE | p::STATE_ZERO)],
            vec![(8192, 0), (4096, p::STATE_DIRTY), (53248, 0)],
        ),
        (p::CMD_FLAG_REQ_ONE, 65536, vec![(8192, p::STATE_HOLE | p::STATE_ZERO)], vec![(8192, 0)]),
    ] {
        let handle = client.send_request(flags, p::CMD_BLOCK_STATUS, 0, length, &[]);
        for index in 0..=p::DIRTY_BITMAPS_MAX {
            let chunk = client.chunk();
            assert_eq!((chunk.handle, chunk.reply_type), (handle, p::REPLY_TYPE_BLOCK_STATUS));
            let last = index == p::DIRTY_BITMAPS_MAX;
            assert_eq!(chunk.flags, if last { p::REPLY_FLAG_DONE } else { 0 }, "only the last chunk is done");
            let id = u32::from_be_bytes(chunk.payload[0..4].try_into().unwrap());
            assert_eq!(id, index as u32 + p::META_BASE_ALLOCATION_ID, "contexts answer in the order of their ids");
            let descriptors: Vec<(u32, u32)> = chunk.payload[4..]
                .chunks(8)
                .map(|d| {
                    (u32::from_be_bytes(d[0..4].try_into().unwrap()), u32::from_be_bytes(d[4..8].try_into().unwrap()))
                })
                .collect();
            assert_eq!(descriptors, if index == 0 { allocation.clone() } else { dirty.clone() });
        }
    }
    // The connection carries on.
    assert_eq!(client.read_structured(8192, 4).unwrap(), vec![1; 4]);
}

#[test]
fn block_status_needs_a_selected_context_for_the_same_export() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(client.option(p::OPT_STRUCTURED_REPLY, &[])[0].reply_type, p::REP_ACK);
    // Selected for another export than the one used.
    let replies = client.option(p::OPT_SET_META_CONTEXT, &meta_data(DISK, &[p::META_BASE_ALLOCATION]));
    assert_eq!(replies[0].reply_type, p::REP_META_CONTEXT);
    assert_eq!(client.option(p::OPT_GO, &info_data(SPARSE, &[])).last().unwrap().reply_type, p::REP_ACK);
    let handle = client.send_request(0, p::CMD_BLOCK_STATUS, 0, 4096, &[]);
    let chunk = client.chunk();
    assert_eq!(chunk.handle, handle);
    assert_eq!(chunk.error().0, p::EINVAL);
    // The connection carries on.
    assert_eq!(client.read_structured(0, 16).unwrap(), vec![0; 16]);
}

#[test]
fn block_status_reports_holes_and_honours_req_one() {
    let server = TestServer::start();
    server.export(SPARSE).set_contents(8192, &[1; 4096]);
    let mut client = RawClient::tcp(server.address);
    client.connect_export(SPARSE, STRUCTURED);
    let status = |client: &mut RawClient, flags, offset, length| -> Vec<(u32, u32)> {
        let handle = client.send_request(flags, p::CMD_BLOCK_STATUS, offset, length, &[]);
        let chunk = client.chunk();
        assert_eq!((chunk.handle, chunk.reply_type), (handle, p::REPLY_TYPE_BLOCK_STATUS));
        assert_eq!(chunk.flags, p::REPLY_FLAG_DONE);
        assert_eq!(&chunk.payload[0..4], &p::META_BASE_ALLOCATION_ID.to_be_bytes());
        chunk.payload[4..]
            .chunks(8)
            .map(|d| (u32::from_be_bytes(d[0..4].try_into().unwrap()), u32::from_be_bytes(d[4..8].try_into().unwrap())))
            .collect()
    };
    let hole = p::STATE_HOLE | p::STATE_ZERO;
    assert_eq!(status(&mut client, 0, 0, 65536), vec![(8192, hole), (4096, 0), (53248, hole)]);
    assert_eq!(status(&mut client, p::CMD_FLAG_REQ_ONE, 0, 65536), vec![(8192, hole)]);
    assert_eq!(status(&mut client, p::CMD_FLAG_REQ_ONE, 8192, 100), vec![(100, 0)]);
    // Past the end: EINVAL, and the connection survives.
    let handle = client.send_request(0, p::CMD_BLOCK_STATUS, SPARSE_BYTES as u64, 1, &[]);
    let chunk = client.chunk();
    assert_eq!((chunk.handle, chunk.error().0), (handle, p::EINVAL));
    assert_eq!(status(&mut client, 0, 12288, 4096), vec![(4096, hole)]);
}

#[test]
fn bad_request_magic_closes_the_connection() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    let mut request = vec![0u8; 28];
    request[0..4].copy_from_slice(&0x1256_0953u32.to_be_bytes());
    client.send(&request);
    client.expect_closed();
    assert_healthy(&mut bystander, 12);
}

#[test]
fn options_after_transmission_started_close_the_connection() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    client.send_option(p::OPT_LIST, &[]);
    client.expect_closed();
    assert_healthy(&mut bystander, 13);
}

#[test]
fn unknown_commands_and_flags_get_einval_and_the_connection_survives() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    let before = server.export(DISK).snapshot();
    for (flags, command, length) in [
        (0, p::CMD_CACHE, 4096),
        (0, 8, 4096),
        (0, 0xffff, 0),
        (1 << 9, p::CMD_READ, 4096),
        (p::CMD_FLAG_REQ_ONE, p::CMD_READ, 4096),
        (p::CMD_FLAG_NO_HOLE, p::CMD_TRIM, 4096),
        // DF needs structured replies.
        (p::CMD_FLAG_DF, p::CMD_READ, 4096),
        (0, p::CMD_BLOCK_STATUS, 4096),
    ] {
        let handle = client.send_request(flags, command, 0, length, &[]);
        assert_eq!(client.simple_reply(handle), p::EINVAL, "command {command} flags {flags:#x}");
    }
    // A WRITE with a bad flag: refused, and its payload skipped so the stream
    // stays in step.
    let data = pattern(20, 8192);
    let handle = client.send_request(p::CMD_FLAG_REQ_ONE, p::CMD_WRITE, 0, 8192, &data);
    assert_eq!(client.simple_reply(handle), p::EINVAL);
    assert_eq!(server.export(DISK).snapshot(), before);
    assert_healthy(&mut client, 14);
    assert_healthy(&mut bystander, 15);
}

#[test]
fn requests_past_the_end_are_refused_and_the_connection_survives() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    let (size, _) = client.connect_export(DISK, SIMPLE);
    assert_eq!(size, DISK_BYTES as u64);
    let before = server.export(DISK).snapshot();

    assert_eq!(client.read(size - 511, 512), Err(p::EINVAL));
    assert_eq!(client.read(u64::MAX - 10, 512), Err(p::EINVAL));
    // The spec asks for ENOSPC when a write runs past the end.
    assert_eq!(client.write(size - 511, &pattern(30, 512)), p::ENOSPC);
    assert_eq!(client.write(u64::MAX, &pattern(31, 512)), p::ENOSPC);
    let handle = client.send_request(0, p::CMD_WRITE_ZEROES, size, 1, &[]);
    assert_eq!(client.simple_reply(handle), p::ENOSPC);
    let handle = client.send_request(0, p::CMD_TRIM, size - 1, 2, &[]);
    assert_eq!(client.simple_reply(handle), p::EINVAL);

    assert_eq!(server.export(DISK).snapshot(), before);
    // The last byte is still reachable.
    assert_eq!(client.write(size - 1, &[7]), 0);
    assert_eq!(client.read(size - 1, 1).unwrap(), vec![7]);
    assert_healthy(&mut client, 16);
    assert_healthy(&mut bystander, 17);
}

#[test]
fn structured_errors_carry_a_message() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    let (size, _) = client.connect_export(DISK, STRUCTURED);
    let (errno, message) = client.read_structured(size, 512).unwrap_err();
    assert_eq!(errno, p::EINVAL);
    assert!(message.contains("beyond the export size"), "{message}");
    let data = pattern(40, 4096);
    assert_eq!(client.write(4096, &data), 0, "successful writes get simple replies");
    assert_eq!(client.read_structured(4096, 4096).unwrap(), data);
}

#[test]
fn zero_length_requests_are_refused() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    for command in [p::CMD_READ, p::CMD_WRITE, p::CMD_TRIM, p::CMD_WRITE_ZEROES] {
        let handle = client.send_request(0, command, 0, 0, &[]);
        assert_eq!(client.simple_reply(handle), p::EINVAL, "command {command}");
    }
    // Flush must have zero offset and length.
    let handle = client.send_request(0, p::CMD_FLUSH, 0, 0, &[]);
    assert_eq!(client.simple_reply(handle), 0);
    let handle = client.send_request(0, p::CMD_FLUSH, 4096, 0, &[]);
    assert_eq!(client.simple_reply(handle), p::EINVAL);
    assert_healthy(&mut client, 18);
    assert_healthy(&mut bystander, 19);
}

#[test]
fn writes_to_a_read_only_export_get_eperm() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    let (_, flags) = client.connect_export(READ_ONLY, SIMPLE);
    assert_eq!(flags & p::FLAG_READ_ONLY, p::FLAG_READ_ONLY);
    let before = server.export(READ_ONLY).snapshot();
    assert_eq!(client.write(0, &pattern(50, 4096)), p::EPERM);
    assert_eq!(client.write(u64::MAX, &pattern(50, 4096)), p::EPERM);
    for command in [p::CMD_TRIM, p::CMD_WRITE_ZEROES] {
        let handle = client.send_request(p::CMD_FLAG_FUA, command, 0, 4096, &[]);
        assert_eq!(client.simple_reply(handle), p::EPERM);
    }
    assert_eq!(client.read(0, 4096).unwrap(), before[..4096]);
    assert_eq!(server.export(READ_ONLY).snapshot(), before);
    assert_healthy(&mut bystander, 20);
}

#[test]
fn huge_write_lengths_disconnect_without_reading_the_payload() {
    let (server, mut bystander) = server_and_bystander();
    for length in [u32::MAX, p::PAYLOAD_BYTES_MAX + 1] {
        let mut client = RawClient::tcp(server.address);
        client.connect_export(DISK, SIMPLE);
        client.send_request(0, p::CMD_WRITE, 0, length, &[]);
        // No payload is sent; a server that tried to read (or allocate) it
        // would not hang up.
        client.expect_closed();
    }
    // The limit itself is fine (the export is smaller, so ENOSPC, but the
    // payload is consumed and the connection lives).
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    let payload = vec![0x5a; p::PAYLOAD_BYTES_MAX as usize];
    assert_eq!(client.write(0, &payload), p::ENOSPC);
    assert_healthy(&mut client, 21);
    assert_healthy(&mut bystander, 22);
}

#[test]
fn oversized_reads_get_einval() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    assert_eq!(client.read(0, p::PAYLOAD_BYTES_MAX + 1), Err(p::EINVAL));
    assert_eq!(client.read(0, DISK_BYTES as u32).map(|d| d.len()), Ok(DISK_BYTES));
}

#[test]
fn abrupt_disconnect_mid_payload_leaves_the_export_unchanged() {
    let (server, mut bystander) = server_and_bystander();
    let before = server.export(DISK).snapshot();
    let writes_before = server.export(DISK).writes.load(std::sync::atomic::Ordering::Relaxed);
    for sent in [0, 1, 1000, 65535] {
        let mut client = RawClient::tcp(server.address);
        client.connect_export(DISK, SIMPLE);
        let payload = pattern(60, 65536);
        client.send_request(0, p::CMD_WRITE, 0, 65536, &payload[..sent]);
        client.close_write();
        // The server closes only after it has given up on this connection.
        client.expect_closed();
    }
    assert_eq!(server.export(DISK).snapshot(), before);
    assert_eq!(server.export(DISK).writes.load(std::sync::atomic::Ordering::Relaxed), writes_before);
    assert_healthy(&mut bystander, 23);
}

#[test]
fn disconnect_mid_handshake_and_mid_header() {
    let (server, mut bystander) = server_and_bystander();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    client.send(b"IHAVE");
    client.close_write();
    client.expect_closed();

    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, SIMPLE);
    client.send(&p::REQUEST_MAGIC.to_be_bytes());
    client.close_write();
    client.expect_closed();
    assert_healthy(&mut bystander, 24);
}

#[test]
fn stalled_handshakes_time_out() {
    let config = ServerConfig { handshake_timeout: Duration::from_millis(500), ..ServerConfig::default() };
    let server = TestServer::with_config(config);
    let mut bystander = RawClient::unix(&server.socket);
    bystander.connect_export(DISK, SIMPLE);

    // Silent after the greeting.
    let started = Instant::now();
    let mut silent = RawClient::tcp(server.address);
    silent.recv(18);
    // Trickling one byte at a time does not extend the deadline.
    let mut trickle = RawClient::tcp(server.address);
    trickle.start(p::FLAG_C_FIXED_NEWSTYLE);
    let option = {
        let mut message = b"IHAVEOPT".to_vec();
        message.extend_from_slice(&p::OPT_INFO.to_be_bytes());
        message.extend_from_slice(&1000u32.to_be_bytes());
        message.extend_from_slice(&[0; 1000]);
        message
    };
    for byte in option.iter().cycle().take(40) {
        // The pause is the misbehaviour under test, not synchronisation.
        std::thread::sleep(Duration::from_millis(25));
        if std::io::Write::write_all(&mut trickle.stream, &[*byte]).is_err() {
            break;
        }
    }
    trickle.expect_closed();
    silent.expect_closed();
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(started.elapsed() < Duration::from_secs(10));

    // Transmission has no such timeout: the bystander was idle all along.
    assert_healthy(&mut bystander, 25);
}

#[test]
fn connections_beyond_the_limit_are_refused_with_a_message() {
    let config = ServerConfig { connections_max: 2, ..ServerConfig::default() };
    let server = TestServer::with_config(config);
    let mut first = RawClient::tcp(server.address);
    first.connect_export(DISK, SIMPLE);
    let mut second = RawClient::unix(&server.socket);
    second.recv(18);
    assert_eq!(server.server.connection_count(), 2);

    for mut refused in [RawClient::tcp(server.address), RawClient::unix(&server.socket)] {
        assert_eq!(refused.expect_refused(), "server full: 2 connections (limit 2); try again later");
    }
    // NBD_OPT_EXPORT_NAME has no error reply: a refused one is hung up on.
    let mut refused = RawClient::tcp(server.address);
    refused.start(p::FLAG_C_FIXED_NEWSTYLE);
    refused.send_option(p::OPT_EXPORT_NAME, DISK.as_bytes());
    refused.expect_closed();
    // So is one that says nothing, once the refusal's deadline passes.
    let started = Instant::now();
    let mut silent = RawClient::tcp(server.address);
    silent.recv(18);
    silent.expect_closed();
    assert!(started.elapsed() < CLIENT_TIMEOUT);

    // A slot frees up once a client leaves.
    second.send(&p::FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    assert_eq!(second.option(p::OPT_ABORT, &[])[0].reply_type, p::REP_ACK);
    second.expect_closed();
    let mut third = RawClient::tcp(server.address);
    third.connect_export(DISK, SIMPLE);
    assert_healthy(&mut third, 26);
    assert_healthy(&mut first, 27);
}

#[test]
fn idle_view_connections_from_one_address_do_not_lock_out_another() {
    // The defaults: no address may take more than its share.
    let config = ServerConfig::default();
    let server = TestServer::with_config(config);
    let here = "127.0.0.1".parse().unwrap();
    let mut idle = Vec::new();
    let mut refused = 0;
    for _ in 0..64 {
        let mut client = RawClient::tcp_from(here, server.address);
        if idle.len() < config.connections_per_client_max {
            client.connect_export(READ_ONLY, SIMPLE);
            idle.push(client);
        } else {
            let message = client.expect_refused();
            assert_eq!(
                message,
                format!(
                    "server full for 127.0.0.1: {0} connections from it (limit {0} per client); close one and try \
                     again",
                    config.connections_per_client_max
                )
            );
            refused += 1;
        }
    }
    assert_eq!(refused, 64 - config.connections_per_client_max);
    let mut other = RawClient::tcp_from("127.0.0.2".parse().unwrap(), server.address);
    other.connect_export(DISK, SIMPLE);
    assert_healthy(&mut other, 28);
    // The Unix socket's users are limited the same way, by user id.
    let config = ServerConfig { connections_per_client_max: 1, ..ServerConfig::default() };
    let server = TestServer::with_config(config);
    let mut first = RawClient::unix(&server.socket);
    first.connect_export(DISK, SIMPLE);
    let message = RawClient::unix(&server.socket).expect_refused();
    assert!(message.starts_with("server full for Unix socket user "), "{message}");
    let mut by_tcp = RawClient::tcp(server.address);
    by_tcp.connect_export(DISK, SIMPLE);
    assert_healthy(&mut by_tcp, 29);
}

#[test]
fn idle_view_connections_are_closed_after_the_idle_timeout() {
    let idle_timeout = Duration::from_secs(1);
    let config =
        ServerConfig { connections_max: 4, idle_timeout_read_only: Some(idle_timeout), ..ServerConfig::default() };
    assert_eq!(config.idle_timeout, None, "writable exports have no idle timeout by default");
    let server = TestServer::with_config(config);
    let mut live = RawClient::tcp(server.address);
    live.connect_export(DISK, SIMPLE);
    let started = Instant::now();
    let views: Vec<RawClient> = (0..3)
        .map(|_| {
            let mut view = RawClient::tcp(server.address);
            view.connect_export(READ_ONLY, SIMPLE);
            view
        })
        .collect();
    assert!(RawClient::tcp(server.address).expect_refused().starts_with("server full: 4 connections"));
    for mut view in views {
        view.expect_closed();
    }
    assert!(started.elapsed() >= idle_timeout);
    // Now there is room, and the idle writable connection was left alone.
    let mut busy = RawClient::tcp(server.address);
    busy.connect_export(READ_ONLY, SIMPLE);
    live.expect_nothing_pending();
    assert_healthy(&mut live, 30);
    // A view that keeps asking stays past the timeout: each request resets
    // its clock. (The pauses are the client's behaviour under test.)
    let started = Instant::now();
    while started.elapsed() < 3 * idle_timeout {
        busy.read(0, 512).expect("a view that keeps reading is served");
        std::thread::sleep(idle_timeout / 4);
    }
    busy.expect_closed();
}

#[test]
fn too_many_options_close_the_connection() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.start(p::FLAG_C_FIXED_NEWSTYLE);
    for _ in 0..rewind_nbd::server::OPTIONS_PER_HANDSHAKE_MAX {
        assert_eq!(client.option(p::OPT_STRUCTURED_REPLY, &[])[0].reply_type, p::REP_ACK);
    }
    client.send_option(p::OPT_STRUCTURED_REPLY, &[]);
    client.expect_closed();
}

#[test]
fn export_name_honours_no_zeroes() {
    let server = TestServer::start();
    for (flags, reply_bytes) in [(p::FLAG_C_FIXED_NEWSTYLE, 134), (p::FLAG_C_FIXED_NEWSTYLE | p::FLAG_C_NO_ZEROES, 10)]
    {
        let mut client = RawClient::tcp(server.address);
        client.start(flags);
        client.send_option(p::OPT_EXPORT_NAME, DISK.as_bytes());
        let reply = client.recv(reply_bytes);
        assert_eq!(u64::from_be_bytes(reply[0..8].try_into().unwrap()), DISK_BYTES as u64);
        assert!(reply[10..].iter().all(|&b| b == 0));
        // The next bytes are the reply to this request, so the length was exact.
        assert_healthy(&mut client, 28);
    }
}

#[test]
fn pipelined_requests_are_all_answered() {
    let server = TestServer::start();
    let mut client = RawClient::tcp(server.address);
    client.connect_export(DISK, STRUCTURED);
    // Many requests sent back to back before reading any reply, as qemu and
    // fio do; also the GO and the first requests share a segment. Replies
    // may come in any order; the handles tell them apart.
    let mut writes = std::collections::HashMap::new();
    for i in 0..64u64 {
        let data = pattern(i as u8, 4096);
        writes.insert(client.send_request(0, p::CMD_WRITE, i * 4096, 4096, &data), i);
    }
    for _ in 0..64 {
        match client.any_reply(|_| 0) {
            Reply::Simple { handle, errno: 0, .. } => assert!(writes.remove(&handle).is_some(), "handle {handle}"),
            other => panic!("unexpected reply {other:?}"),
        }
    }
    let mut reads: std::collections::HashMap<u64, u64> =
        (0..64u64).map(|i| (client.send_request(0, p::CMD_READ, i * 4096, 4096, &[]), i)).collect();
    for _ in 0..64 {
        let Reply::Chunk(chunk) = client.any_reply(|_| 0) else { panic!("reads get structured replies") };
        let i = reads.remove(&chunk.handle).expect("a reply to each read, once");
        assert_eq!(chunk.reply_type, p::REPLY_TYPE_OFFSET_DATA);
        assert_eq!(&chunk.payload[8..], &pattern(i as u8, 4096)[..], "block {i}");
    }
}

#[test]
fn fast_zero_is_advertised_only_when_the_export_can() {
    let server = TestServer::start();
    let mut dense = RawClient::tcp(server.address);
    let (_, flags) = dense.connect_export(DISK, SIMPLE);
    assert_eq!(flags & p::FLAG_SEND_FAST_ZERO, 0);
    let handle = dense.send_request(p::CMD_FLAG_FAST_ZERO, p::CMD_WRITE_ZEROES, 0, 4096, &[]);
    assert_eq!(dense.simple_reply(handle), p::EINVAL);

    let mut sparse = RawClient::tcp(server.address);
    let (_, flags) = sparse.connect_export(SPARSE, SIMPLE);
    assert_eq!(flags & p::FLAG_SEND_FAST_ZERO, p::FLAG_SEND_FAST_ZERO);
    assert_eq!(sparse.write(0, &[9; 8192]), 0);
    let handle = sparse.send_request(p::CMD_FLAG_FAST_ZERO | p::CMD_FLAG_NO_HOLE, p::CMD_WRITE_ZEROES, 0, 8192, &[]);
    assert_eq!(sparse.simple_reply(handle), 0);
    assert_eq!(sparse.read(0, 8192).unwrap(), vec![0; 8192]);
}
