use super::*;

fn view(members: &[&str]) -> View {
    View::new(members.iter().map(|m| (m.to_string(), 0)), BTreeMap::new())
}

fn view_of(step: Step) -> Option<View> {
    match step {
        Step::Serve(served) => Some(served.view),
        _ => None,
    }
}

fn namespaces() -> Vec<String> {
    (0..300).map(|i| format!("team-{i}")).collect()
}

#[test]
fn a_replica_that_joins_takes_only_namespaces_of_its_own_and_each_replica_gets_a_share() {
    let three = view(&["a", "b", "c"]);
    let four = view(&["a", "b", "c", "d"]);
    let mut shares = BTreeMap::<&str, usize>::new();
    for ns in namespaces() {
        let (before, after) = (three.owner(&ns).unwrap(), four.owner(&ns).unwrap());
        assert!(after == before || after == "d", "{ns} moved from {before} to {after}");
        *shares.entry(before).or_default() += 1;
    }
    for (member, share) in shares {
        assert!((60..=140).contains(&share), "{member} serves {share} of 300");
    }
    assert_eq!(View::default().owner("team"), None);
}

#[test]
fn a_pin_to_a_live_replica_wins_and_a_pin_to_another_is_ignored() {
    let free = view(&["a", "b"]);
    let ns = namespaces().into_iter().find(|ns| free.owner(ns) == Some("a")).unwrap();
    let pinned = View::new([("a".into(), 0), ("b".into(), 0)], [(ns.clone(), "b".into())].into());
    assert_eq!(pinned.owner(&ns), Some("b"));
    let gone = View::new([("a".into(), 0), ("b".into(), 0)], [(ns.clone(), "z".into())].into());
    assert_eq!(gone.owner(&ns), Some("a"));
}

#[test]
fn a_digest_is_the_same_for_the_same_view_and_changes_with_members_or_pins() {
    assert_eq!(view(&["b", "a", "a"]).digest(), view(&["a", "b"]).digest());
    assert_ne!(view(&["a", "b"]).digest(), view(&["a", "b", "c"]).digest());
    assert_ne!(view(&["ab"]).digest(), view(&["a", "b"]).digest());
    let pinned = View::new([("a".into(), 0)], [("team".into(), "a".into())].into());
    assert_ne!(pinned.digest(), view(&["a"]).digest());
    let again = View::new([("a".into(), 1)], BTreeMap::new());
    assert_ne!(again.digest(), view(&["a"]).digest(), "a replica back under its name is another view");
    assert_eq!(again.owner("team"), Some("a"));
}

fn lease(holder: &str, renewed: Timestamp, view: Option<&View>) -> Seen {
    Seen {
        holder: Some(holder.into()),
        renewed: Some(renewed),
        duration: Duration::from_secs(15),
        incarnation: 0,
        view: view.map(View::digest),
    }
}

#[tokio::test(start_paused = true)]
async fn a_replica_serves_once_every_live_lease_shows_its_view_and_drains_before_showing_another() {
    let wall = Timestamp::now();
    let mut ring = Ring::new("a".into(), 0);
    let both = view(&["a", "b"]);
    let b_alone = view(&["b"]);
    let leases = vec![lease("b", wall, Some(&b_alone))];
    let publish = ring.step(&leases, BTreeMap::new(), Instant::now(), wall);
    assert_eq!(publish, Step::Publish { drain: false, digest: both.digest() });
    assert_eq!(ring.step(&leases, BTreeMap::new(), Instant::now(), wall), publish, "shown once written");
    ring.published(both.digest());
    assert_eq!(ring.step(&leases, BTreeMap::new(), Instant::now(), wall), Step::Hold, "b shows another view");
    let agreed = vec![lease("b", wall, Some(&both))];
    assert_eq!(view_of(ring.step(&agreed, BTreeMap::new(), Instant::now(), wall)), Some(both.clone()));
    assert_eq!(ring.step(&agreed, BTreeMap::new(), Instant::now(), wall), Step::Hold);

    // b goes quiet: after its duration on this clock it is dead, and a drains first.
    tokio::time::advance(Duration::from_secs(14)).await;
    assert_eq!(ring.step(&agreed, BTreeMap::new(), Instant::now(), wall), Step::Hold);
    tokio::time::advance(Duration::from_secs(1)).await;
    let alone = view(&["a"]);
    assert_eq!(
        ring.step(&agreed, BTreeMap::new(), Instant::now(), wall),
        Step::Publish { drain: true, digest: alone.digest() }
    );
    assert_eq!(ring.serving(), None);
    ring.published(alone.digest());
    assert_eq!(view_of(ring.step(&agreed, BTreeMap::new(), Instant::now(), wall)), Some(alone));
}

#[tokio::test(start_paused = true)]
async fn leases_released_or_long_dead_are_not_members_and_a_renewal_keeps_one_live() {
    let wall = Timestamp::now();
    let mut ring = Ring::new("a".into(), 0);
    let ancient = wall - std::time::Duration::from_secs(31);
    let released = Seen { holder: None, ..lease("c", wall, None) };
    let leases = vec![lease("b", ancient, None), released, lease("d", wall, None)];
    let Step::Publish { digest, .. } = ring.step(&leases, BTreeMap::new(), Instant::now(), wall) else {
        panic!("a new ring is shown")
    };
    assert_eq!(digest, view(&["a", "d"]).digest());
    // d renews every 5 s: it stays live well past its duration.
    let mut renewed = wall;
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(5)).await;
        renewed += std::time::Duration::from_secs(5);
        let step = ring.step(&[lease("d", renewed, None)], BTreeMap::new(), Instant::now(), renewed);
        assert!(matches!(step, Step::Publish { ref digest, .. } if *digest == view(&["a", "d"]).digest()));
    }
}

/// b restarts under its name while a serves their view: b's new incarnation makes a new view,
/// so b waits for a to show it (which a does only after it stopped serving the old), however
/// soon b lists a's Lease.
#[tokio::test(start_paused = true)]
async fn a_replica_back_under_its_name_waits_for_the_others_to_see_it_again() {
    let wall = Timestamp::now();
    let old = view(&["a", "b"]);
    let new = View::new([("a".into(), 0), ("b".into(), 1)], BTreeMap::new());
    let mut b = Ring::new("b".into(), 1);
    let a_old = vec![lease("a", wall, Some(&old))];
    assert_eq!(
        b.step(&a_old, BTreeMap::new(), Instant::now(), wall),
        Step::Publish { drain: false, digest: new.digest() }
    );
    b.published(new.digest());
    assert_eq!(b.step(&a_old, BTreeMap::new(), Instant::now(), wall), Step::Hold, "a still shows the old view");

    let mut a = Ring::new("a".into(), 0);
    a.published(old.digest());
    let b_old = Seen { incarnation: 0, ..lease("b", wall, Some(&old)) };
    assert_eq!(view_of(a.step(&[b_old], BTreeMap::new(), Instant::now(), wall)), Some(old.clone()));
    let b_new = Seen { incarnation: 1, ..lease("b", wall, Some(&new)) };
    assert_eq!(
        a.step(&[b_new], BTreeMap::new(), Instant::now(), wall),
        Step::Publish { drain: true, digest: new.digest() }
    );
    let a_new = vec![lease("a", wall, Some(&new))];
    assert_eq!(view_of(b.step(&a_new, BTreeMap::new(), Instant::now(), wall)), Some(new));
}

/// a serves {a, b}; b dies and a serves alone: what was a's continues, b's does not. Then c joins
/// and dies before a sees the ring agree: c may have served its share of {a, c} meanwhile, so
/// that share does not continue when a serves alone again.
#[tokio::test(start_paused = true)]
async fn a_namespace_continues_only_if_it_stayed_this_replicas_in_every_view_shown_between() {
    let wall = Timestamp::now();
    let (ab, a_only, ac) = (view(&["a", "b"]), view(&["a"]), view(&["a", "c"]));
    let mut ring = Ring::new("a".into(), 0);
    let b = vec![lease("b", wall, Some(&ab))];
    let Step::Publish { digest, .. } = ring.step(&b, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    ring.published(digest);
    let Step::Serve(first) = ring.step(&b, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    assert!(namespaces().iter().all(|ns| !first.continues(ns)), "nothing continues at the start");

    tokio::time::advance(Duration::from_secs(15)).await;
    let Step::Publish { digest, .. } = ring.step(&b, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    ring.published(digest);
    let Step::Serve(alone) = ring.step(&b, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    for ns in namespaces() {
        assert_eq!(alone.continues(&ns), ab.owner(&ns) == Some("a"), "{ns}");
    }

    let c = vec![lease("c", wall, Some(&ac))];
    let Step::Publish { digest, .. } = ring.step(&c, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    ring.published(digest);
    tokio::time::advance(Duration::from_secs(15)).await;
    let Step::Publish { digest, .. } = ring.step(&c, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    ring.published(digest);
    let Step::Serve(again) = ring.step(&c, BTreeMap::new(), Instant::now(), wall) else { panic!() };
    assert_eq!(again.view, a_only);
    let mut lost = 0;
    for ns in namespaces() {
        assert_eq!(again.continues(&ns), ac.owner(&ns) == Some("a"), "{ns}");
        lost += usize::from(!again.continues(&ns));
    }
    assert!(lost > 0);
}

/// A Lease that claims years and is never renewed, or shows a view that is no digest at all,
/// holds the ring only as long as an honest Lease could.
#[tokio::test(start_paused = true)]
async fn a_lease_claiming_years_or_showing_garbage_holds_the_ring_no_longer_than_the_longest_lease() {
    let wall = Timestamp::now();
    let mut ring = Ring::new("a".into(), 0);
    let forever = Seen {
        duration: Duration::from_secs(i32::MAX as u64),
        view: Some("x".repeat(256 * 1024)),
        ..lease("z", wall, None)
    };
    let forever = [forever];
    let Step::Publish { digest, .. } = ring.step(&forever, BTreeMap::new(), Instant::now(), wall) else {
        panic!("a new ring is shown")
    };
    assert_eq!(digest, view(&["a", "z"]).digest());
    ring.published(digest);
    assert_eq!(ring.step(&forever, BTreeMap::new(), Instant::now(), wall), Step::Hold, "z shows no view");
    tokio::time::advance(MAX_LEASE - Duration::from_secs(1)).await;
    assert_eq!(ring.step(&forever, BTreeMap::new(), Instant::now(), wall), Step::Hold);
    tokio::time::advance(Duration::from_secs(1)).await;
    let alone = view(&["a"]);
    let step = ring.step(&forever, BTreeMap::new(), Instant::now(), wall);
    assert_eq!(step, Step::Publish { drain: false, digest: alone.digest() }, "z is dead after the longest Lease");
    ring.published(alone.digest());
    assert_eq!(view_of(ring.step(&forever, BTreeMap::new(), Instant::now(), wall)), Some(alone));
}

#[test]
fn a_pin_of_any_size_or_to_no_replica_leaves_the_namespace_to_the_ring() {
    let members = view(&["a", "b", "c"]);
    let pins: BTreeMap<String, String> = [
        ("team-1".to_owned(), "x".repeat(64 * 1024)),
        ("team-2".to_owned(), String::new()),
        ("team-3".to_owned(), "a\nb".to_owned()),
    ]
    .into();
    let pinned = View::new(members.members.clone(), pins);
    for ns in ["team-1", "team-2", "team-3"] {
        assert_eq!(pinned.owner(ns), members.owner(ns), "{ns}");
    }
    assert_ne!(pinned.digest(), members.digest(), "pins are part of the view, whatever they say");
}
