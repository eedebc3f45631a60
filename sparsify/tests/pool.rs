//! `join_global_pool` in a process of its own (the global pool can be built only once).

use sparsify::{ErrorFeedback, ExactTopK, Selector};

#[test]
fn the_calling_thread_becomes_a_worker_and_a_second_build_is_refused() {
    assert!(matches!(
        sparsify::join_global_pool(Some(0)),
        Err(sparsify::Error::InvalidArgument(_))
    ));
    assert_eq!(rayon::current_thread_index(), None);
    sparsify::join_global_pool(Some(2)).unwrap();
    assert_eq!(rayon::current_thread_index(), Some(0));
    assert_eq!(sparsify::threads(), 2);
    // A pass split over the pool, started from this thread, still selects exactly.
    let d = 1 << 21;
    let g: Vec<f32> = (0..d).map(|i| ((i * 7919) % 1000) as f32 - 500.0).collect();
    let mut ef = ErrorFeedback::new(d);
    let mut sel = ExactTopK::new();
    let (sg, _) = ef.step(&mut sel as &mut dyn Selector, &g, 1000).unwrap();
    assert_eq!(sg.nnz(), 1000);
    assert!(sg.values().iter().all(|v| v.abs() >= 499.0));
    assert!(matches!(
        sparsify::join_global_pool(None),
        Err(sparsify::Error::InvalidArgument(_))
    ));
}
