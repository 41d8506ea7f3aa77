"""What the console computes from the cluster's answers, in process: the shards' due-time
histograms added up on the first one's buckets, and their leaders' topics, pending counts
and groups added up by name."""

from __future__ import annotations

from tickwheel.client import ClusterInfo, DueHistogram, GroupInfo, TopicDue, TopicPending
from tickwheel.console.views import merge, merge_infos


def _histogram(start_ms: int, counts: tuple[int, ...], overdue: int = 0, beyond: int = 0,
               pending: tuple[TopicPending, ...] = ()) -> DueHistogram:
    return DueHistogram(now_ms=start_ms, start_ms=start_ms, bucket_ms=1_000, counts=counts,
                        overdue=overdue, beyond=beyond, cursor_second=0, pending=pending,
                        pending_untracked=1)


def test_shards_add_up_on_the_first_ones_buckets() -> None:
    merged = merge([
        _histogram(10_000, (1, 2, 3), overdue=1, pending=(TopicPending("a", 6),)),
        _histogram(11_000, (10, 20, 30), beyond=2,  # began a second later: one bucket on
                   pending=(TopicPending("a", 60), TopicPending("b", 1))),
        _histogram(9_000, (100, 200, 300))])  # a second earlier: its first is overdue
    assert merged.counts == (1 + 200, 2 + 10 + 300, 3 + 20)
    assert (merged.overdue, merged.beyond) == (1 + 100, 2 + 30)
    assert merged.pending == (TopicPending("a", 66), TopicPending("b", 1))
    assert merged.pending_untracked == 3
    assert sum(merged.counts) + merged.overdue + merged.beyond == 6 + 1 + 60 + 2 + 600


def test_one_shard_is_its_own_histogram() -> None:
    alone = _histogram(5_000, (4, 5), overdue=2, beyond=3, pending=(TopicPending("a", 14),))
    assert merge([alone]) == alone


def _info(shard: int, topics: tuple[TopicDue, ...], pending: tuple[TopicPending, ...],
          groups: tuple[GroupInfo, ...]) -> ClusterInfo:
    return ClusterInfo(address=f"raft-{shard}", role="leader", leader=f"raft-{shard}",
                       leader_grpc="", term=1, commit_index=0, last_applied=0, cursor_second=0,
                       cursor_local_index=0, stamp_ms=0, dispatching=True, cursor_lag_ms=0,
                       pending_untracked=shard, readied_past_cursor=0, members=(),
                       topics=topics, pending=pending, groups=groups, shard=shard)


def test_the_shards_leaders_answers_add_up_by_topic_and_group() -> None:
    first = _info(0, (TopicDue("a", 1, 2, 1, 10),), (TopicPending("a", 5),),
                  (GroupInfo("a", "", 1, 2, 1, 0),))
    second = _info(1, (TopicDue("a", 3, 0, 1, 7), TopicDue("b", 1, 1, 1, 1)),
                   (TopicPending("a", 4), TopicPending("b", 2)),
                   (GroupInfo("a", "", 3, 0, 1, 5), GroupInfo("b", "g", 1, 1, 1, 0)))
    merged = merge_infos([first, second])
    assert merged is not None
    assert merged.topics == (TopicDue("a", 4, 2, 2, 17), TopicDue("b", 1, 1, 1, 1))
    assert merged.pending == (TopicPending("a", 9), TopicPending("b", 2))
    assert merged.groups == (GroupInfo("a", "", 4, 2, 2, 5), GroupInfo("b", "g", 1, 1, 1, 0))
    assert (merged.pending_untracked, merged.address) == (1, "raft-0")
    assert merge_infos([first]) is first and merge_infos([]) is None
