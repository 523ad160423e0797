//! Synchronous requests and the requester's "signals".
//!
//! A [`Call`] is one synchronous request; its [`Signal`] plays the role of
//! the requesting task's signals: `interrupt()` is an ordinary signal (the
//! kernel's interruptible wait), `kill()` a fatal one (the killable wait).

use super::bg::WaitSlot;
use super::req::{flag, Args, ReplyPayload, ReqResult, Request};
use super::{Core, Errno};
use crate::sync::{lock, wait, Arc, AtomicU8, Mutex, Ordering};

const SIG_INT: u8 = 1;
const SIG_KILL: u8 = 2;

/// Where the requester is parked, so a signal can wake it.
enum Park {
    None,
    Admission(Arc<WaitSlot>),
    Request(Arc<Request>),
}

/// Shared between a [`Call`] and its [`Signal`]s.
pub(crate) struct SigState {
    bits: AtomicU8,
    park: Mutex<Park>,
    core: Arc<Core>,
}

impl SigState {
    pub(crate) fn new(core: Arc<Core>) -> Arc<SigState> {
        Arc::new(SigState {
            bits: AtomicU8::new(0),
            park: Mutex::new(Park::None),
            core,
        })
    }

    pub(crate) fn killed(&self) -> bool {
        self.bits.load(Ordering::SeqCst) & SIG_KILL != 0
    }

    fn interrupted(&self) -> bool {
        self.bits.load(Ordering::SeqCst) & (SIG_INT | SIG_KILL) != 0
    }

    /// Registers the admission slot before the requester checks for
    /// signals under `bg_lock`, so a signal sent meanwhile finds it.
    pub(crate) fn park_on_slot(&self, slot: Arc<WaitSlot>) {
        *lock(&self.park) = Park::Admission(slot);
    }

    fn park_on_request(&self, req: Arc<Request>) {
        *lock(&self.park) = Park::Request(req);
    }

    fn raise(&self, bit: u8) {
        self.bits.fetch_or(bit, Ordering::SeqCst);
        let target = match &*lock(&self.park) {
            Park::None => return,
            Park::Admission(s) => Park::Admission(s.clone()),
            Park::Request(r) => Park::Request(r.clone()),
        };
        // Wake the requester under the lock it sleeps on, so the wake-up
        // cannot fall between its check and its sleep.
        match target {
            Park::Admission(slot) => {
                let _bg = lock(&self.core.bg);
                slot.cv.notify_all();
            }
            Park::Request(req) => {
                let _d = lock(&req.data);
                req.waitq.notify_all();
            }
            Park::None => {}
        }
    }
}

/// A handle to signal the requester of a [`Call`] from another thread.
#[derive(Clone)]
pub struct Signal(Arc<SigState>);

impl std::fmt::Debug for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signal")
            .field("bits", &self.0.bits.load(Ordering::SeqCst))
            .finish()
    }
}

impl Signal {
    /// An ordinary signal: the request is marked INTERRUPTED and, once the
    /// server has it, a FUSE_INTERRUPT is queued. The requester keeps
    /// waiting for the reply.
    pub fn interrupt(&self) {
        self.0.raise(SIG_INT);
    }

    /// A fatal signal: a request the server has not seen is withdrawn
    /// (EINTR); otherwise an abort-on-kill request aborts the connection;
    /// in every case the requester returns only after the request FINISHED.
    pub fn kill(&self) {
        self.0.raise(SIG_KILL);
    }
}

/// One synchronous request.
pub struct Call {
    core: Arc<Core>,
    args: Args,
    sig: Arc<SigState>,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("opcode", &self.args.opcode)
            .finish()
    }
}

impl Call {
    pub(crate) fn new(core: Arc<Core>, args: Args) -> Call {
        let sig = SigState::new(core.clone());
        Call { core, args, sig }
    }

    /// A handle to interrupt or kill this call while it waits.
    pub fn signal(&self) -> Signal {
        Signal(self.sig.clone())
    }

    /// Waits for admission, sends the request and waits for its answer.
    pub fn wait(self) -> ReqResult {
        let Call { core, args, sig } = self;
        let force = args.force;
        core.add_waiting();
        if !force {
            if let Err(e) = core.get_req(false, &sig) {
                core.drop_waiting();
                return Err(e);
            }
        }
        let mut flags = flag::ISREPLY | flag::WAITING;
        if force {
            flags |= flag::FORCE;
        }
        let req = Request::new(
            &core,
            core.next_unique(),
            args,
            flags,
            core.clock.now(),
            None,
        );
        sig.park_on_request(req.clone());
        if let Err(r) = core.send_req(req.clone()) {
            r.set_error(core.abort_errno().0);
            core.request_end(&r);
        }
        let r = wait_answer(&core, &req, &sig);
        // Signals sent after the call returned find nothing to wake, and
        // hold no reference that would keep the request counted as waiting.
        *lock(&sig.park) = Park::None;
        r
    }
}

/// Waits for FINISHED (kernel `request_wait_answer`).
fn wait_answer(core: &Arc<Core>, req: &Arc<Request>, sig: &Arc<SigState>) -> ReqResult {
    let force = req.flags.test(flag::FORCE);
    if !force {
        // Interruptible phase.
        if !core.no_interrupt.load(Ordering::SeqCst) {
            let mut d = lock(&req.data);
            loop {
                if req.flags.test(flag::FINISHED) {
                    drop(d);
                    return result(req);
                }
                if sig.interrupted() {
                    break;
                }
                d = wait(&req.waitq, d);
            }
            drop(d);
            req.flags.set(flag::INTERRUPTED);
            if req.flags.test(flag::SENT) {
                core.interrupt(req);
            }
        }
        // Killable phase.
        let mut d = lock(&req.data);
        loop {
            if req.flags.test(flag::FINISHED) {
                drop(d);
                return result(req);
            }
            if sig.killed() {
                break;
            }
            d = wait(&req.waitq, d);
        }
        drop(d);
        if core.remove_pending(req) {
            // The server never saw it.
            return Err(Errno::EINTR);
        }
        if req.args.abort_on_kill {
            core.abort();
        }
    }
    // Uninterruptible: the server (or a copier) still holds the request;
    // its result, and its buffer, come back only when it has FINISHED.
    let mut d = lock(&req.data);
    while !req.flags.test(flag::FINISHED) {
        d = wait(&req.waitq, d);
    }
    drop(d);
    result(req)
}

fn result(req: &Arc<Request>) -> ReqResult {
    let mut d = lock(&req.data);
    if d.error != 0 {
        Err(Errno(d.error))
    } else {
        Ok(ReplyPayload {
            data: std::mem::take(&mut d.out),
            pages: std::mem::take(&mut d.pages),
            in_client: d.in_client,
        })
    }
}
