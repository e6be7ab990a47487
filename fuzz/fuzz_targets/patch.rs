//! Applies fuzz input as patches to a valid template: `[offset: u32 LE][len: u8][len bytes]`
//! repeated, each offset taken modulo `span`. Random bytes alone almost never get past a magic
//! number or a schema hash; patching a real file reaches the checks behind them.

/// Overwrites parts of `buf[..span]` as `data` says.
#[allow(dead_code)] // `shm_header` writes the patches itself, through `patches`
pub fn apply(buf: &mut [u8], span: usize, data: &[u8]) {
    let span = span.min(buf.len());
    for (at, bytes) in patches(span, data) {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// The patches `data` describes over `span` bytes: (offset, bytes), each inside `0..span`,
/// in the order `apply` writes them.
pub fn patches(span: usize, mut data: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    std::iter::from_fn(move || {
        if span == 0 || data.len() < 5 {
            return None;
        }
        let off = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % span;
        let len = usize::from(data[4]);
        data = &data[5..];
        let take = len.min(data.len()).min(span - off);
        let bytes = &data[..take];
        data = &data[len.min(data.len())..];
        Some((off, bytes))
    })
}
