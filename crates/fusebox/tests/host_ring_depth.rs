//! `fusebox mount --io-uring` keeps many requests in flight per queue
//! thread: READs, O_DIRECT WRITEs, syncs and FALLOCATEs start on the
//! thread's io_uring and the thread goes on serving. The bodies are in
//! `common/depth.rs`, shared with the /dev/fuse transport.

mod common;

use common::depth::{self, Mode};

#[test]
fn sixteen_reads_are_in_flight_at_once_on_one_queue_thread() {
    depth::sixteen_reads_are_in_flight_at_once_on_one_queue_thread(Mode::Ring);
}

#[test]
fn reads_at_depth_match_the_host_file_at_random_offsets() {
    depth::reads_at_depth_match_the_host_file_at_random_offsets(Mode::Ring);
}

#[test]
fn a_hung_read_does_not_stall_the_other_requests_of_its_queue() {
    depth::a_hung_read_does_not_stall_the_other_requests_of_its_queue(Mode::Ring);
}

#[test]
fn an_abort_with_every_entry_holding_a_hung_read_ends_cleanly() {
    depth::an_abort_with_every_entry_holding_a_hung_read_ends_cleanly(Mode::Ring);
}

#[test]
fn one_io_uring_caller_at_depth_16_gets_16_reads_in_flight() {
    depth::one_io_uring_caller_at_depth_16_gets_16_reads_in_flight(Mode::Ring);
}

#[test]
fn more_lock_waits_than_entries_do_not_stall_the_unlock() {
    depth::more_lock_waits_than_entries_do_not_stall_the_unlock(Mode::Ring);
}

#[test]
fn writes_submitted_together_start_on_the_queue_thread_and_land_whole() {
    depth::writes_submitted_together_start_on_the_queue_thread_and_land_whole(Mode::Ring);
}

#[test]
fn a_started_write_runs_as_the_writer() {
    depth::a_started_write_runs_as_the_writer(Mode::Ring);
}

#[test]
fn direct_reads_and_writes_at_depth_match_a_model_of_the_file() {
    depth::direct_reads_and_writes_at_depth_match_a_model_of_the_file(Mode::Ring);
}

#[test]
fn syncs_and_fallocates_submitted_together_start_on_the_queue_thread() {
    depth::syncs_and_fallocates_submitted_together_start_on_the_queue_thread(Mode::Ring);
}
