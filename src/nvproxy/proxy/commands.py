"""The commands of the proxy's control socket (server.py accepts the connection
and checks the peer): a checkpoint into a file, the hand-over of everything to
a new proxy (migration), and usage figures; plus the thread that prepares the
host image buffer while the application runs.

A DMTCP checkpoint (from the plugin, native/shim/dmtcp.c) may have its GPU image written while DMTCP writes the
process's own image and after the program resumes (dmtcp_overlap.py): the proxy then says "captured" once the device
memory is in its buffer, and the image's writer keeps the outcome for `nvproxy checkpoint --dmtcp`, which waits for
it."""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from typing import Any

from .. import wire
from ..checkpoint import hostimage, reach
from ..checkpoint.concurrent import Concurrent, Options
from ..checkpoint.dump import dump, estimate, prefault
from ..checkpoint.image import WriteError
from ..checkpoint.parent import Parent
from ..checkpoint.parent import find as find_parent
from ..checkpoint.reach import scan_image
from . import control
from .handlers.ipc import export_event, export_fd

REQ = wire.REQ


def handle(server: Any, conn: socket.socket, msg: dict[str, Any]) -> bool:
    """Run one command; True when a thread answers later (conn is then its)."""
    cmd = msg.get("cmd")
    if cmd == "checkpoint":
        if not isinstance(msg.get("image"), str) or not msg["image"]:
            control.send(conn, {"ok": False, "error": "a checkpoint command without an image path"})
            return False
        checkpoint(server, conn, msg["image"], bool(msg.get("disconnect")), bool(msg.get("incremental")),
                   bool(msg.get("verify")), msg.get("concurrent"), bool(msg.get("notices")))
        return True
    if cmd == "overlap":  # nvproxy checkpoint --dmtcp: how the next DMTCP checkpoint's GPU image is written
        if msg.get("clear"):
            server.dmtcp.disarm(str(msg.get("token", "")))
        else:
            concurrent = msg.get("concurrent")
            server.dmtcp.arm_next(str(msg.get("token", "")), str(msg.get("mode")), float(msg.get("for_s", 0)),
                                  None if concurrent is None else bool(concurrent))
        control.send(conn, {"ok": True})
    elif cmd == "written":  # ... and then what came of it, once its image is written
        threading.Thread(target=_answer_written, args=(server, conn, str(msg.get("token", "")),
                                                       float(msg.get("wait_s", 600))),
                         name="nvproxy-written", daemon=True).start()
        return True
    elif cmd == "usage":
        st = server.dispatch.state
        used = sum(n for d in st.devices.values() for _va, n in d.arena.mappings())
        control.send(conn, {"ok": True, "device_bytes": used, "image_estimate": estimate(st),
                            "buffer_bytes": st.host_image.capacity if st.host_image else 0})
    elif cmd == "buffer":
        # a migration's new proxy maps and registers the host image buffer while the
        # application still runs, so that its restore is a copy (see hand_over)
        himg = hostimage.of(server.dispatch.state)
        control.send(conn, {"ok": True, "bytes": himg.capacity}, b"", [himg.fd])
    elif cmd == "ipc_fd":  # another proxy opens device memory this one's application exported
        fd, size = export_fd(server.dispatch.state, int(msg.get("base", 0)), int(msg.get("token", 0)))
        try:
            control.send(conn, {"ok": True, "size": size}, b"", [fd])
        finally:
            os.close(fd)
    elif cmd == "ipc_event":  # another proxy opens an event this one's application exported
        handle = export_event(server.dispatch.state, int(msg.get("event", 0)), int(msg.get("token", 0)))
        control.send(conn, {"ok": True, "handle": handle.hex()})
    elif cmd == "drain":  # (a DMTCP checkpoint: every process's device work is over before any is saved)
        server.quiesce()
        control.send(conn, {"ok": True})
    elif cmd == "handoff":
        hand_over(server, conn, msg.get("image"))
    else:
        control.send(conn, {"ok": False, "error": f"unknown command {cmd!r}"})
    return False


def _dump(server: Any, disconnect: bool = False, parent: Parent | None = None, concurrent: bool = False
          ) -> tuple[hostimage.HostImage, dict[str, Any]]:
    """Stop at a cut, let the device drain and copy everything into the host
    image buffer (parent: but what is unchanged since that image).  Returns the buffer, still locked, and the
    statistics (stats["cut"]: the epoch of write tracking the image closes).
    The idle device is the time to unregister spare staging buffers (and, where the application's shim drops its
    channels after this checkpoint, theirs: disconnect): unregistering waits for running kernels.
    concurrent: the device memory is copied out after the release (checkpoint/concurrent.py): stats["concurrent"]
    is the Concurrent, whose drain() the writer runs before stats["finish"]()."""
    from .handlers.memory import drop_staging  # (handlers import the server, which imports this)

    state = server.dispatch.state
    t0 = time.monotonic()
    himg = hostimage.locked(state)
    conc = Concurrent(state, himg, Options.from_env()) if concurrent else None
    try:
        taken = server.quiesce()
        cut = reach.of(state).cut()
        drop_staging(server.dispatch, server.channels if disconnect else ())
        stats = dump(state, himg, parent, conc.take if conc is not None else None)
        if conc is not None and "finish" in stats:
            conc.install(server.dispatch)
            server.gate = functools.partial(conc.gate, server.dispatch)
            stats["concurrent"] = conc
        else:
            hostimage.before_release(himg)
    except BaseException:
        if conc is not None:
            conc.free_spare()
        hostimage.after_checkpoint(state, himg)
        raise
    stats["stopped_s"] = time.monotonic() - t0
    stats["taken_at_cut"] = taken  # (requests the application had sent that ran before the cut)
    stats["cut"] = cut
    stats["mappings"] = reach.of(state).mappings()
    return himg, stats


def _answer_written(server: Any, conn: socket.socket, token: str, wait_s: float) -> None:
    try:
        control.send(conn, server.dmtcp.outcome(token, wait_s))
    except OSError:
        pass
    conn.close()


def checkpoint(server: Any, conn: socket.socket, path: str, disconnect: bool = False, incremental: bool = False,
               verify: bool = False, concurrent: bool | None = None, notices: bool = False) -> None:
    """The application goes on as soon as the device memory is in the buffer (concurrent: as soon as it is safe,
    see checkpoint/concurrent.py; None: as NVPROXY_CKPT_CONCURRENT says; for DMTCP's, disconnect, as the arm of
    nvproxy checkpoint --dmtcp says, else never);
    a thread writes the file from it and then answers.  incremental: only what may have changed since the last
    image written into the same directory is copied from the device (verify: everything is, and compared).
    notices: a concurrent checkpoint says when the application goes on ({"notice": "released"}) before its reply.
    A DMTCP checkpoint's (disconnect) image may be written while DMTCP writes (dmtcp_overlap.py): the plugin then hears
    "captured" (with the image's id, and whether to wait for the answer) once the device memory is in the buffer, and
    a failure to write is said here."""
    overlap, token, dmtcp_concurrent = server.dmtcp.begin() if disconnect else ("off", None, False)
    if disconnect:
        concurrent = dmtcp_concurrent
    elif concurrent is None:
        concurrent = os.environ.get("NVPROXY_CKPT_CONCURRENT", "0") == "1"
    tracking = reach.of(server.dispatch.state)
    parent, note = find_parent(tracking, path, verify) if incremental else (None, "")
    try:
        himg, stats = _dump(server, disconnect, parent, concurrent)
    except BaseException as e:
        if parent is not None:
            parent.close()
        server.dmtcp.finished(token, {"ok": False, "error": f"the device memory could not be copied out: {e}"})
        raise
    before = server.writer
    if notices and "concurrent" in stats:
        try:
            control.send(conn, {"notice": "released", "stopped_s": stats["stopped_s"]})
        except OSError:
            pass  # (the reply will find the connection gone too)
    if overlap != "off":
        try:
            # (a concurrent checkpoint's statistics have the id once it is finished; its plan has it now)
            image_id = stats.get("id") or (stats["plan"].header["id"] if "plan" in stats else "")
            control.send(conn, {"notice": "captured", "image_id": image_id, "hold": overlap == "write",
                                "stopped_s": stats["stopped_s"]})
        except OSError:
            pass

    def persist() -> None:
        try:
            conc = stats.pop("concurrent", None)
            if conc is not None:
                stats["drain_s"] = conc.drain()
                stats.pop("plan")
                stats.update(stats.pop("finish")())
                hostimage.before_release(himg)
                stats["concurrent"] = conc.report()
            t = time.monotonic()
            reuse = stats.pop("reuse", [])
            himg.write_file(path, stats["image_bytes"], (parent.fd, reuse) if parent is not None else None)
            stats["file_s"] = time.monotonic() - t
            if not stats.get("broken"):
                tracking.scanned(scan_image(himg, stats, tracking))
                tracking.images[os.path.dirname(path)] = {"path": path, "id": stats["id"], "cut": stats["cut"]}
            stats.pop("scan", None), stats.pop("mappings", None)
            if parent is not None:
                stats["parent"] = parent.path
            if note:
                stats["note"] = note
            reply = {"ok": True, "image_id": stats.get("id", ""), "stats": dict(stats, path=path)}
        except WriteError as e:  # (it names path; the temporary file is gone)
            reply = {"ok": False, "error": str(e)}
        except Exception as e:
            reply = {"ok": False, "error": f"cannot write {path}: {e}"}
        finally:
            hostimage.after_checkpoint(server.dispatch.state, himg)
            if parent is not None:
                parent.close()
        server.dmtcp.finished(token, dict(reply, path=path))
        if overlap != "off" and not reply["ok"]:  # (the plugin may not be listening: the program runs on)
            print(f"nvproxy: the GPU image of this DMTCP checkpoint was not written ({reply['error']}); a restart "
                  "from this checkpoint will fail", file=sys.stderr)
        try:
            control.send(conn, reply)
        except OSError:
            pass
        conn.close()
        if before is not None:  # (whoever waits for the last writer, the proxy's end, waits for every answer)
            before.join()

    server.writer = threading.Thread(target=persist, name="nvproxy-image-writer")
    server.writer.start()


def hand_over(server: Any, conn: socket.socket, image: str | None) -> None:
    """Migration: the image stays in the host image buffer, whose memfd the new
    proxy gets with the connections (image: also write it to this file)."""
    himg, stats = _dump(server)
    for k in ("reuse", "scan", "mappings"):  # (the image is whole, and this proxy ends)
        stats.pop(k, None)
    try:
        if image:
            himg.write_file(image, stats["image_bytes"])
    finally:
        himg.lock.release()  # (kept whatever the mode: the new proxy maps it, or this one goes on)
    chans = sorted(server.channels, key=lambda c: c.tid)
    if server.callback_channel is not None and server.callback_channel not in chans:
        chans.append(server.callback_channel)
    # requests after the cut travel as raw frames, still stamped with their seq
    pending: dict[Any, list[bytes]] = {ch: [] for ch in chans}
    for seq, _t, ch, op, flags, args, payload in sorted(server.heap, key=lambda e: (e[0], e[1])):
        if ch in pending:
            pending[ch].append(REQ.pack(REQ.size + len(payload), op, flags, seq, *args) + payload)
    blob = bytearray()
    descs = []
    fds = [server.listener.fileno(), 2]
    state = server.dispatch.state
    for ch in chans:
        raw = b"".join(pending[ch]) + bytes(ch.rbuf)
        st = state.host.get(ch.staging[0]) if ch.staging else None
        descs.append({"tid": ch.tid, "kind": ch.kind, "dev": ch.dev, "async_err": ch.async_err,
                      "pending": [len(blob), len(raw)], "staging": ch.staging[1] if st else 0,
                      "mailbox": ch.mailbox is not None})
        blob += raw
        fds.append(ch.sock.fileno())
        if st:
            fds.append(st.fd)
        if ch.mailbox is not None:
            fds.append(ch.mailbox.fd)
    host: list[tuple[int, Any]] = sorted((a, r) for a, r in state.host.items() if r.channel is None)
    host += sorted(state.managed.items())  # (migrating managed memory: its host copy's memfd, by its address)
    fds += [r.fd for _a, r in host]
    # the memory the application exported through CUDA IPC: the new proxy maps the same memory (others use it)
    exported = [(base, export_fd(state, base, token)[0]) for base, token in sorted(state.ipc_exports.items())]
    fds += [fd for _b, fd in exported] + [himg.fd]
    try:
        control.send(conn, {"ok": True, "stats": stats, "next_seq": server.next_seq, "channels": descs,
                            "host": [a for a, _r in host], "ipc_exported": [b for b, _fd in exported]},
                     bytes(blob), fds)
    finally:
        for _b, fd in exported:
            os.close(fd)
    verdict, _b, _f = control.recv(conn)
    if verdict.get("cmd") == "done":
        if server.writer is not None:  # (a checkpoint's answer is on its way: not cut off by the exit)
            server.writer.join()
        print(f"nvproxy: handed over to the new proxy ({stats['device_bytes'] >> 20} MiB in "
              f"{stats['seconds']:.2f} s)", file=sys.stderr)
        os.unlink(server.ctl_path)
        os._exit(0)  # the socket path and every connection now belong to the new proxy
    print(f"nvproxy: the new proxy could not restore ({verdict.get('error')}); going on here", file=sys.stderr)


def prefault_loop(server: Any) -> None:
    """Keep the host image buffer as large as a checkpoint would need (see checkpoint/hostimage.py)."""
    while server.running:
        time.sleep(0.5)
        if server.dispatch.state.broken:  # (nothing to copy out of a broken context, nor can memory be pinned)
            continue
        try:
            prefault(server.dispatch.state)
        except RuntimeError:
            pass  # the state changed while it was measured: next time
        except Exception as e:  # (out of memory, say) checkpoints will grow it themselves
            print(f"nvproxy: cannot prepare the checkpoint buffer ({e}); a checkpoint will take longer",
                  file=sys.stderr)
            return
