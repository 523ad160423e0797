//! The vhost-user side of the device: what the frontend asks of a
//! `VhostUserBackend` (features, config space, vring stop and reset, memory
//! table, events), split from `device.rs`.

use super::ids::Event;
use super::*;
use fuse_core::server::state::StateError;
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserShMemConfig,
};
use vhost::vhost_user::Backend;

impl<F: Filesystem + 'static> VhostUserBackend for FsDevice<F> {
    type Bitmap = LogBitmap;
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        1 + usize::from(self.inner.cfg.request_queues.max(1))
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.inner.cfg.queue_size)
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_INDIRECT_DESC
            | VIRTIO_RING_F_EVENT_IDX
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            // Live migration: the device logs its writes to guest memory
            // (`migration.rs`).
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn acked_features(&self, features: u64) {
        self.inner.acked.store(features, Ordering::Relaxed);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut f = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
            | VhostUserProtocolFeatures::DEVICE_STATE
            | VhostUserProtocolFeatures::LOG_SHMFD;
        if self.inner.cfg.tag.is_some() {
            f |= VhostUserProtocolFeatures::CONFIG;
        }
        if self.inner.dax.is_some() {
            // The DAX window: a shared memory region, and the back-end
            // channel its mappings are asked for on.
            f |= VhostUserProtocolFeatures::SHMEM | VhostUserProtocolFeatures::BACKEND_REQ;
        }
        f
    }

    fn get_shmem_config(&self) -> io::Result<VhostUserShMemConfig> {
        match &self.inner.dax {
            Some(dax) => Ok(VhostUserShMemConfig::new(1, &[dax.size()])),
            None => Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
    }

    fn set_backend_req_fd(&self, backend: Backend) {
        if let Some(dax) = &self.inner.dax {
            dax.set_backend(backend);
        }
    }

    fn set_event_idx(&self, enabled: bool) {
        self.inner.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cs = &self.inner.config_space;
        let start = (offset as usize).min(cs.len());
        let end = start.saturating_add(size as usize).min(cs.len());
        cs[start..end].to_vec()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // GET_VRING_BASE: the frontend takes the vring back and learns how
        // far the device popped it; before a migration that index goes to
        // the destination, which never sees a chain popped here. So every
        // popped chain is answered first (`drain_vring`, bounded): a lock
        // call that waits is interrupted so that it ends (EINTR) rather
        // than hold the stop. What is still unanswered after the bound is
        // given up (`give_up`): its late reply never reaches the guest,
        // and it never acts on the host afterwards.
        // The hiprio queue has nothing in flight once the forgets it took
        // are served (each of its chains goes back once served).
        let Some(q) = self.inner.request_queue(queue_index as usize) else {
            if queue_index as usize == HIPRIO {
                self.stop_hiprio();
            }
            return Ok(());
        };
        self.stop_request_queue(q);
        Ok(())
    }

    fn reset_device(&self) {
        // The driver is gone (a reboot, a driver unbind): answers would
        // land in vrings it no longer has, so nothing is drained; what is
        // in flight is given up at once, and the guest's session ends.
        let all: Vec<RqId> = RqId::all(self.inner.count()).collect();
        // The frontend drops the window's mappings itself; nothing may be
        // sent to it about them now (it waits for this reset).
        if let Some(dax) = &self.inner.dax {
            dax.forget_all();
        }
        self.give_up(&all);
        self.end_session("the device was reset");
    }

    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        phase: VhostTransferStatePhase,
        file: std::fs::File,
    ) -> io::Result<Option<std::fs::File>> {
        if direction == VhostTransferStateDirection::SAVE {
            // The guest's DAX mappings cannot move: the destination's
            // window would be empty under a guest that believes its ranges
            // mapped. Refused while any exist (QEMU's generic vhost-user
            // device blocks migration anyway).
            let mapped = self
                .inner
                .dax
                .as_ref()
                .map_or(Some(0), |d| d.mappings_now());
            let why = match mapped {
                Some(0) => None,
                Some(n) => Some(format!("{n} DAX mapping(s) cannot migrate")),
                None => Some("a DAX mapping request is in progress".to_string()),
            };
            if let Some(why) = why {
                log::warn!("migration refused: {why}");
                return Err(io::Error::other(why));
            }
            // FORGETs the guest sent before the stop reach the filesystem
            // first: the state then carries the lookup counts the guest
            // holds, and no inode it let go of (a file it deleted, which
            // find-paths could not name).
            self.stop_hiprio();
        }
        let upgrade = |weak: &Weak<Inner<F>>| {
            weak.upgrade()
                .ok_or_else(|| StateError::refused("the device is gone"))
        };
        let weak = Arc::downgrade(&self.inner);
        let save = move || upgrade(&weak)?.engine.fs().save_state();
        let weak = Arc::downgrade(&self.inner);
        let load = move |buf: Vec<u8>| {
            let inner = upgrade(&weak)?;
            migration::load(inner.engine.dispatcher(), &buf, &inner.migration)
        };
        self.inner
            .migration
            .start(direction, phase, file, save, load)
            .map(|()| None)
    }

    fn check_device_state(&self) -> io::Result<()> {
        self.inner.migration.check()
    }

    fn update_memory(&self, mem: GuestMem) -> io::Result<()> {
        if let Some(dax) = &self.inner.dax {
            dax.guard(&mem.memory());
        }
        *write(&self.inner.mem) = Some(mem);
        self.inner.mem_gen.fetch_add(1, Ordering::SeqCst);
        self.inner.maps.clear();
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One vring thread per request queue (they run in parallel); the
        // first also serves hiprio.
        Vq::threads(self.inner.count())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) =
            new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()?;
        // vhost-user-backend 0.24 registers the consumer with `into_raw_fd`
        // and never closes it: one fd per vring thread per connection.
        // Remember it (with a duplicate, so that only that very file is
        // ever closed) and close it when the device goes.
        self.inner.exit_fds.record(&consumer);
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if !evset.contains(EventSet::IN) {
            return Ok(());
        }
        // A thread's vrings (`queues_per_thread`) come numbered from 0 as
        // device events; the events past num_queues are the device's own
        // (`ids.rs`: `Event`).
        let count = self.inner.count();
        if thread_id == 0 {
            // Thread 0's first vring is hiprio (`Vq::threads`): kept for
            // the watchdog, which serves it while this thread is stuck.
            if let Some(hiprio) = vrings.first() {
                self.inner.hiprio.keep_vring(hiprio);
            }
        }
        let (vring, q) = match Event::decode(device_event, count) {
            Event::Kick(ev) => {
                let Some(q) = Vq::of_kick(thread_id, ev, count) else {
                    return Ok(());
                };
                let Some(vring) = vrings.get(ev) else {
                    return Ok(());
                };
                (vring, q)
            }
            Event::Other => return Ok(()),
            Event::Completions(q) => {
                // Its thread's io_uring completions (`complete_inline`).
                if q.thread() == thread_id {
                    self.on_completions(q);
                }
                return Ok(());
            }
            Event::Resume(q) => {
                let _ = self.inner.queue(q).resume.read();
                let Some(vring) = vrings.get(Vq::Request(q).kick_event()) else {
                    return Ok(());
                };
                // The event loop checks a vring's state for kicks only.
                if q.thread() != thread_id || !vring.get_ref().is_enabled() {
                    return Ok(());
                }
                (vring, Vq::Request(q))
            }
        };
        if let Vq::Request(q) = q {
            let _ = self.inner.queue(q).vring.get_or_init(|| vring.clone());
        }
        // An error here would end this vring thread for good: count it and
        // keep serving on the next event instead.
        if self.serve_queue(vring, q).is_err() {
            self.inner.counters(q).add_malformed(1);
        }
        Ok(())
    }
}
