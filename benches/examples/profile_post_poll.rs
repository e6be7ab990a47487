//! A fixed amount of the `post_poll` bench's work, for instruction profiles:
//! `valgrind --tool=callgrind target/release/examples/profile_post_poll BATCH ROUNDS [SIZE] [srq]`
//! (instructions per message = total / (BATCH * ROUNDS), minus the setup; SIZE: bytes per
//! message, 8 by default; above 32 a queued SEND goes by reference; `srq`: the receiver takes
//! its requests from an SRQ, as a pipeline worker's QPs do, so its SENDs take the
//! sender-side path).

use dataplane::verbs::{RecvChain, WorkCompletion};
use dataplane_benches::{round, send_chain, Loopback};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let batch = args.next().and_then(Result::ok).unwrap_or(1).clamp(1, 64);
    let rounds = args.next().and_then(Result::ok).unwrap_or(100_000);
    let size = args.next().and_then(Result::ok).unwrap_or(8) as u32;
    let srq = std::env::args().nth(4).is_some_and(|a| a == "srq");
    let mut lb = Loopback::with_size_srq("profile-post-poll", size, srq);
    let mut rchain = RecvChain::with_capacity(64, 64);
    let mut wc = [WorkCompletion::default(); 64];
    let chain = send_chain(&lb, batch);
    for _ in 0..rounds {
        round(&mut lb, &chain, &mut rchain, &mut wc);
    }
    println!("{} messages of {} bytes in chains of {batch}", rounds * batch, lb.size);
}
