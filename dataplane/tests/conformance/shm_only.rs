//! Cases that need a view only the `shm` provider gives (it counts retries exactly).

use crate::harness::*;
use crate::ShmHarness;
use dataplane::verbs::*;
use dataplane::Qp;

/// `rnr_retry = n` (n < 7) means n retries after the first attempt, then RNR_RETRY_EXC_ERR.
#[test]
fn rnr_retry_count_is_exact() {
    for n in [0u8, 1, 3] {
        let t = format!("rnr-exact-{n}");
        let o = ConnOpts { rnr_retry: n, min_rnr_timer: 1, ..Default::default() };
        let mut p = pair::<ShmHarness>(&t, QpType::Rc, QpCaps::default(), o);
        send(&mut p.qa, &p.a, 1, 0, 8);
        let wc = poll_n(&mut p.a.scq, 1)[0];
        assert_eq!(wc.status, WcStatus::RnrRetryExcErr);
        assert_eq!(p.qa.retries(), n as u64, "rnr_retry = {n}");
        assert_eq!(p.qa.state(), QpState::Error);
    }
}

/// `retry_cnt = n` means n retries when the responder never answers, then RETRY_EXC_ERR.
#[test]
fn retry_cnt_is_exact() {
    for n in [0u8, 2] {
        let t = format!("retry-exact-{n}");
        let mut a = Node::<ShmHarness>::open(&t, 0);
        let mut qa = a.qp(QpType::Rc, QpCaps::default(), None, false);
        let o = ConnOpts { retry_cnt: n, timeout: 1, ..Default::default() };
        to_init(&mut qa, 0, o.access);
        // A QPN that names no QP on this fabric.
        to_rtr(&mut qa, &Endpoint { qpn: 0x00ff_fff0, ..Default::default() }, &o);
        to_rts(&mut qa, &o);
        send(&mut qa, &a, 1, 0, 8);
        let wc = poll_n(&mut a.scq, 1)[0];
        assert_eq!(wc.status, WcStatus::RetryExcErr);
        assert_eq!(qa.retries(), n as u64, "retry_cnt = {n}");
    }
}
