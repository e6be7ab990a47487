//! The connection-exchange messages a peer sends over TCP: the rdma-core pingpong endpoint
//! line and the memory message, decoded from the slice and through the stream readers.
#![no_main]

use dataplane::conn;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ep) = conn::decode(data) {
        // What decodes must encode back to a message that decodes to the same endpoint.
        let again = conn::decode(&conn::encode(&ep)).expect("re-decode of an encoded endpoint");
        assert_eq!(format!("{ep:?}"), format!("{again:?}"));
    }
    if let Ok(m) = conn::decode_mem(data) {
        let again = conn::decode_mem(&conn::encode_mem(&m)).expect("re-decode of an encoded memory message");
        assert_eq!(format!("{m:?}"), format!("{again:?}"));
    }
    // The stream readers: a short or garbled stream is an error, never a panic or a hang.
    let mut r = data;
    while conn::read_endpoint(&mut r).is_ok() {}
    let mut r = data;
    while conn::read_mem(&mut r).is_ok() {}
});
