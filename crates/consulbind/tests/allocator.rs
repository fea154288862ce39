//! The controller's allocator as main.rs configures it. jemalloc ignores a configuration it
//! cannot find without a word, and the only sign would be memory per binding a tenth higher.

#[cfg(feature = "jemalloc")]
#[test]
fn jemalloc_runs_with_the_controllers_configuration() {
    // Its statistics, printed at exit, list the options in force.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_consulbind"))
        .arg("--help")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("the controller runs");
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    for option in [
        "opt.narenas: 1\n",
        "opt.tcache_max: 1024\n",
        "opt.background_thread: true ",
        "opt.dirty_decay_ms: 1000 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(stats.contains(option), "{option:?} not in force:\n{stats}");
    }
}
