//! Applies fuzz input as patches to a valid template: `[offset: u32 LE][len: u8][len bytes]`
//! repeated, each offset taken modulo `span`. Random bytes alone almost never get past a magic
//! number or a schema hash; patching a real file reaches the checks behind them.

/// Overwrites parts of `buf[..span]` as `data` says.
pub fn apply(buf: &mut [u8], span: usize, mut data: &[u8]) {
    let span = span.min(buf.len());
    if span == 0 {
        return;
    }
    while data.len() >= 5 {
        let off = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize % span;
        let len = usize::from(data[4]);
        data = &data[5..];
        let take = len.min(data.len()).min(span - off);
        buf[off..off + take].copy_from_slice(&data[..take]);
        data = &data[len.min(data.len())..];
    }
}
