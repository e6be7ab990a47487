//! A latency histogram for a stage's hot path: hdrhistogram's buckets at 3 significant
//! digits, recorded with a few register instructions, turned into an
//! [`hdrhistogram::Histogram`] for the report.
//!
//! `hdrhistogram::Histogram::record` keeps a running total, the minimum and the maximum and
//! checks the value's range on every call: 35 instructions per message in the echo
//! pipeline's sink (callgrind, `profile_pipeline`, session 49). Here a record is a
//! branch-free index (a leading-zero count, a shift, an add) and one increment; the total,
//! the minimum and the maximum are found from the counts when the report is built, once.
//!
//! The layout is hdrhistogram's for a lowest discernible value of 1 and 3 significant digits
//! (2,048 sub-buckets): values below 2,048 have a bucket each; from there each power of two
//! [2^k, 2^(k+1)) is split into 1,024 buckets of width 2^(k-10). So [`to_hdr`] puts every
//! count in the bucket hdrhistogram itself would have used, and every quantile, the minimum,
//! the maximum and the mean it reports are the same as if the values had been recorded there
//! directly (a test checks this).
//!
//! [`to_hdr`]: LogLinearHistogram::to_hdr

use hdrhistogram::Histogram;

/// Buckets per power of two, as a power of two: 2^10 = 1,024, so values below 2^11 = 2,048
/// have a bucket each (hdrhistogram's 2,048 sub-buckets for 3 significant digits).
const SUB_BITS: u32 = 10;

/// The bucket of `v` in a log-linear layout of 2^`sub_bits` buckets per power of two:
/// values below 2^(`sub_bits` + 1) have a bucket each, and from 2^k on (k > `sub_bits`)
/// each power of two [2^k, 2^(k+1)) is split into 2^`sub_bits` buckets of width
/// 2^(k - `sub_bits`). Branch-free: a leading-zero count, a saturating subtract, two shifts
/// and an add. Shared by this histogram and the sinks' live `LatencyBuckets`.
#[inline]
pub(crate) fn log_linear_index(v: u64, sub_bits: u32) -> usize {
    // Below 2^(sub_bits+1) the shift is 0 and the index is the value; from 2^k on it is
    // k - sub_bits, and `v >> shift` is in [2^sub_bits, 2^(sub_bits+1)): each power of two
    // adds 2^sub_bits buckets after the 2^(sub_bits+1) of the first.
    let shift = (u64::BITS - 1 - sub_bits).saturating_sub(v.leading_zeros());
    ((shift as usize) << sub_bits) + (v >> shift) as usize
}

/// The lowest value of bucket `i` of [`log_linear_index`]'s layout (its inverse on bucket
/// boundaries).
pub(crate) fn log_linear_lowest(i: usize, sub_bits: u32) -> u64 {
    let i = i as u64;
    if i < 2 << sub_bits {
        return i;
    }
    let shift = (i >> sub_bits) - 1;
    (i - (shift << sub_bits)) << shift
}

/// Counts of values in hdrhistogram's buckets (3 significant digits) up to a highest value.
#[derive(Debug, Clone)]
pub struct LogLinearHistogram {
    counts: Box<[u64]>,
    high: u64,
}

impl LogLinearHistogram {
    /// An empty histogram of values up to `high` (larger ones are counted as `high`; at
    /// least 2); allocates its counts here, never when recording: 216 KiB for `high` = 60 s
    /// in nanoseconds.
    pub fn new(high: u64) -> LogLinearHistogram {
        let high = high.max(2);
        LogLinearHistogram { counts: vec![0; Self::index_of(high) + 1].into_boxed_slice(), high }
    }

    /// The highest value counted as itself.
    pub fn high(&self) -> u64 {
        self.high
    }

    /// The bucket of `v` (at most `high`).
    #[inline]
    fn index_of(v: u64) -> usize {
        log_linear_index(v, SUB_BITS)
    }

    /// The lowest value of bucket `i` (the inverse of `index_of` on bucket boundaries).
    fn lowest_of(i: usize) -> u64 {
        log_linear_lowest(i, SUB_BITS)
    }

    /// Counts `v` (values above [`high`](Self::high) as `high`). No allocation, no branch
    /// on the value's size.
    #[inline]
    pub fn record(&mut self, v: u64) {
        let i = Self::index_of(v.min(self.high));
        // In range: `index_of` is monotonic and the counts end at `index_of(high)`.
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    /// The same counts as an hdrhistogram of values 1 to `high` at 3 significant digits:
    /// what a report reads percentiles from. Allocates; call it off the hot path.
    pub fn to_hdr(&self) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, self.high, 3).expect("valid bounds: 1 <= high, 3 digits");
        for (i, &c) in self.counts.iter().enumerate().filter(|(_, &c)| c > 0) {
            // In range: the lowest value of a bucket is at most `high`.
            let _ = h.record_n(Self::lowest_of(i), c);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::LogLinearHistogram;
    use hdrhistogram::Histogram;

    /// The index and the lowest value of a bucket are inverse on every bucket boundary, and
    /// the index grows by one from each boundary to the next.
    #[test]
    fn buckets_are_contiguous_and_invertible() {
        let top = LogLinearHistogram::index_of(60_000_000_000);
        for i in 0..=top {
            let lo = LogLinearHistogram::lowest_of(i);
            assert_eq!(LogLinearHistogram::index_of(lo), i, "lowest value {lo} of bucket {i}");
            if lo > 0 {
                assert_eq!(LogLinearHistogram::index_of(lo - 1), i - 1, "below bucket {i}");
            }
        }
    }

    /// Against hdrhistogram fed the same values directly: the same count, minimum, maximum,
    /// mean and value at 40 quantiles, over values spread across 2^0..2^36 (and clamped).
    #[test]
    fn reports_what_hdrhistogram_would() {
        let high = 60_000_000_000u64;
        let mut direct = Histogram::<u64>::new_with_bounds(1, high, 3).unwrap();
        let mut ours = LogLinearHistogram::new(high);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..200_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A value of 1..=37 bits, biased to small ones as latencies are; some past `high`.
            let bits = 1 + (x % 37) as u32 * u32::from(n % 3 == 0) + (x >> 60) as u32;
            let v = (x >> 8) & ((1u64 << bits.min(63)) - 1);
            let v = v.max(1);
            direct.record(v.min(high)).unwrap();
            ours.record(v);
        }
        let conv = ours.to_hdr();
        assert_eq!(ours.len(), direct.len());
        assert_eq!((conv.len(), conv.min(), conv.max()), (direct.len(), direct.min(), direct.max()));
        assert_eq!(conv.mean(), direct.mean());
        for k in 0..=40 {
            let q = f64::from(k) / 40.0;
            assert_eq!(conv.value_at_quantile(q), direct.value_at_quantile(q), "quantile {q}");
        }
        assert_eq!(conv.value_at_quantile(0.999), direct.value_at_quantile(0.999));
    }

    /// Values above `high` count as `high`; an empty histogram converts to an empty one.
    #[test]
    fn clamps_to_high_and_converts_empty() {
        let mut h = LogLinearHistogram::new(10_000);
        assert!(h.is_empty() && h.to_hdr().is_empty());
        h.record(u64::MAX);
        h.record(10_000);
        assert_eq!(h.len(), 2);
        let c = h.to_hdr();
        assert_eq!(c.max(), c.highest_equivalent(10_000));
        assert_eq!(c.count_at(10_000), 2);
    }
}
