//! N independent selectors of one kind round-robin with a stream pass.
use sparsify::{ErrorFeedback, Selector, SelectorKind};
use std::time::Instant;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let e: u32 = a[1].parse().unwrap();
    let rho: f64 = a[2].parse().unwrap();
    let name = &a[3];
    let reps: usize = a[4].parse().unwrap();
    let nsel: usize = a[5].parse().unwrap();
    let d = 1usize << e;
    let k = ((d as f64 * rho) as usize).max(1);
    let mk = |seed: u64| -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..d)
            .map(|_| {
                let mut acc = 0.0f32;
                for _ in 0..4 {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    acc += (s >> 40) as f32 / (1u64 << 24) as f32;
                }
                acc - 2.0
            })
            .collect()
    };
    let ng: usize = std::env::var("NG")
        .ok()
        .map(|v| v.parse().unwrap())
        .unwrap_or(2);
    let mut grads: Vec<Vec<f32>> = (0..ng as u64).map(|i| mk(7 + i)).collect();
    let fresh = std::env::var("FRESH").is_ok();
    let mut fs = 12345u64;
    let mut stream = vec![0.0f32; d];
    let others: Vec<String> = a
        .get(6)
        .map(|s| s.split(',').map(String::from).collect())
        .unwrap_or_default();
    let mut sels: Vec<(Box<dyn Selector>, ErrorFeedback)> = (0..nsel)
        .map(|_| {
            (
                name.parse::<SelectorKind>().unwrap().build(1),
                ErrorFeedback::new(d),
            )
        })
        .collect();
    let mut oth: Vec<(Box<dyn Selector>, ErrorFeedback)> = others
        .iter()
        .map(|o| {
            let kth = sparsify::ExactTopK::new()
                .select(&grads[0], k)
                .unwrap()
                .1
                .threshold;
            let s: Box<dyn Selector> = match o.as_str() {
                "threshold" => Box::new(sparsify::HardThreshold::new(kth).unwrap()),
                "exact-cold" => Box::new(sparsify::ExactTopK::new().with_warm_start(false)),
                "mstopk-cold" => Box::new(sparsify::MsTopK::with_seed(1).with_warm_start(false)),
                "exdyna" => {
                    let mut e = sparsify::ExDyna::new();
                    e.set_threshold(kth);
                    Box::new(e)
                }
                _ => o.parse::<SelectorKind>().unwrap().build(1),
            };
            (s, ErrorFeedback::new(d))
        })
        .collect();
    let (mut ts, mut tf) = (f64::MAX, f64::MAX);
    for rep in 0..reps {
        if fresh {
            for v in grads[0].iter_mut() {
                let mut acc = 0.0f32;
                for _ in 0..4 {
                    fs ^= fs << 13;
                    fs ^= fs >> 7;
                    fs ^= fs << 17;
                    acc += (fs >> 40) as f32 / (1u64 << 24) as f32;
                }
                *v = acc - 2.0;
            }
        }
        let g = &grads[if fresh { 0 } else { rep % ng }];
        let t = Instant::now();
        sparsify::accumulate(&mut stream, g).unwrap();
        std::hint::black_box(&stream);
        ts = ts.min(t.elapsed().as_secs_f64());
        for (sel, ef) in sels.iter_mut() {
            if std::env::var("MUL0").is_ok() {
                ef.residual_mut().iter_mut().for_each(|x| *x *= 0.0);
            } else {
                ef.reset();
            }
            if std::env::var("WARMUP").is_ok() {
                let s1: f32 = ef.residual().iter().sum::<f32>() + g.iter().sum::<f32>();
                std::hint::black_box(s1);
            }
            if std::env::var("TWICE").is_ok() {
                let (sg, _) = ef.step(sel.as_mut(), g, k).unwrap();
                sel.recycle(sg);
                ef.reset();
            }
            let t = Instant::now();
            let (sg, _) = ef.step(sel.as_mut(), g, k).unwrap();
            std::hint::black_box(sg.nnz());
            sel.recycle(sg);
            tf = tf.min(t.elapsed().as_secs_f64());
        }
        for (sel, ef) in oth.iter_mut() {
            ef.reset();
            let (sg, _) = ef.step(sel.as_mut(), g, k).unwrap();
            std::hint::black_box(sg.nnz());
            sel.recycle(sg);
        }
    }
    println!(
        "n {nsel} stream {:.1} us {name} {:.1} us ratio {:.2}",
        ts * 1e6,
        tf * 1e6,
        tf / ts
    );
}
