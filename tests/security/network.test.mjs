// Attack battery: the network. A task must reach nothing: not the worker's
// own nats-server on loopback, not a listener of the host, not the cloud
// metadata address, not DNS, not an external address.
//
// Non-loopback targets (169.254.169.254, 8.8.8.8, DNS) are tried ONLY when
// the code first sees that it sits in an empty network namespace (only `lo`
// in /proc/net/dev, no route): there a send fails with ENETUNREACH before
// any packet exists. Outside a sandbox the code never tries them, and the
// file skips (exit 77) before any case when the worker has no sandbox.
import { describe } from "node:test";
import { createServer } from "node:net";
import { createSocket } from "node:dgram";

import { assert, rand, show, sleep, startBattery } from "./lib/battery.mjs";

const b = await startBattery("network");
const natsPort = b.stack.server.port;

// Python: is this an empty network namespace? Sets GUARD and reports why not.
const GUARD = `
def _netns_state():
    devs = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
    routes = open("/proc/net/route").read().splitlines()[1:]
    return {"devs": devs, "routes": routes}
try:
    NETNS = _netns_state()
except Exception as e:
    NETNS = {"error": repr(e)}
GUARD = NETNS.get("devs") == ["lo"] and NETNS.get("routes") == []
import socket, errno
def tcp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "CONNECTED"
    finally:
        s.close()
def udp(host, port, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        return "SENT %d" % s.sendto(b"ci-sec-udp", (host, port))
    finally:
        s.close()
`;

function assertGuard(rep) {
  assert.equal(rep.guard, true, `the task is not in an empty network namespace: ${JSON.stringify(rep.netns)}`);
}

function assertFailed(rep, key, errnos) {
  const x = rep[key];
  assert.ok(x, `no attempt ${key} in ${JSON.stringify(rep)}`);
  assert.equal(x.ok, false, `${key} must fail inside the sandbox: ${JSON.stringify(x)}`);
  if (errnos) assert.ok(errnos.includes(x.errno), `${key}: errno ${x.errno} (${x.msg}), expected one of ${errnos}`);
}

const ENETUNREACH = 101;
const EADDRNOTAVAIL = 99;
const ECONNREFUSED = 111;
const EAFNOSUPPORT = 97;
const EPERM = 1;

// A TCP listener on the host; counts the connections it gets.
async function tcpListener(host) {
  const srv = createServer((sock) => {
    srv.accepted++;
    sock.destroy();
  });
  srv.accepted = 0;
  await new Promise((resolve, reject) => {
    srv.once("error", reject);
    srv.listen({ host, port: 0 }, resolve);
  });
  return srv;
}

async function udpListener(type, host) {
  const s = createSocket(type);
  s.received = 0; // datagrams but the test's own controls
  s.controls = new Set();
  s.on("message", (m) => {
    const text = m.toString();
    if (text.startsWith("ci-sec-control-")) s.controls.add(text);
    else s.received++;
  });
  await new Promise((resolve, reject) => {
    s.once("error", reject);
    s.bind(0, host, resolve);
  });
  return s;
}

// Sends a control datagram from the host to listener s and waits until it
// arrived: whatever was sent to s before it has arrived by then.
async function udpSettled(s, type, host) {
  const token = `ci-sec-control-${rand()}`;
  const c = createSocket(type);
  try {
    await new Promise((resolve, reject) => c.send(token, s.address().port, host, (e) => (e ? reject(e) : resolve())));
  } finally {
    c.close();
  }
  for (const deadline = Date.now() + 10000; !s.controls.has(token); await sleep(20))
    assert.ok(Date.now() < deadline, `the control datagram to ${host} did not arrive within 10 s`);
}

describe("network", { concurrency: 4 }, () => {
  b.attack("TCP to the test's nats-server on 127.0.0.1 and ::1, and to a host listener on 127.0.0.1, is unreachable", async () => {
    const l4 = await tcpListener("127.0.0.1");
    let l6 = null;
    try {
      l6 = await tcpListener("::1");
    } catch {
      l6 = null; // no IPv6 on this host's loopback
    }
    try {
      const code = `${GUARD}
attempt("nats4", lambda: tcp("127.0.0.1", ${natsPort}))
attempt("nats6", lambda: tcp("::1", ${natsPort}, socket.AF_INET6))
attempt("nats_localhost", lambda: socket.create_connection(("localhost", ${natsPort}), timeout=3))
attempt("listener4", lambda: tcp("127.0.0.1", ${l4.address().port}))
attempt("listener6", lambda: tcp("::1", ${l6 ? l6.address().port : 9}, socket.AF_INET6))
report(guard=GUARD, netns=NETNS)
`;
      const { result: r, report: rep } = await b.run(code);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assertGuard(rep);
      assertFailed(rep, "nats4", [ENETUNREACH]);
      assertFailed(rep, "nats6", [ENETUNREACH, EADDRNOTAVAIL]);
      assertFailed(rep, "nats_localhost");
      assertFailed(rep, "listener4", [ENETUNREACH]);
      assertFailed(rep, "listener6", [ENETUNREACH, EADDRNOTAVAIL]);
      assert.doesNotMatch(r.stdout, /CONNECTED/);
      // Checked from outside: nothing arrived.
      assert.equal(l4.accepted, 0, "the host listener on 127.0.0.1 got a connection");
      if (l6) assert.equal(l6.accepted, 0, "the host listener on ::1 got a connection");
    } finally {
      l4.close();
      l6?.close();
    }
  });

  b.attack("the cloud metadata address 169.254.169.254:80 is unreachable", async () => {
    const code = `${GUARD}
if GUARD:
    attempt("metadata", lambda: tcp("169.254.169.254", 80))
    attempt("metadata_http", lambda: __import__("urllib.request").request.urlopen("http://169.254.169.254/latest/meta-data/", timeout=3).read())
report(guard=GUARD, netns=NETNS)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assertGuard(rep);
    assertFailed(rep, "metadata", [ENETUNREACH]);
    assertFailed(rep, "metadata_http");
    assert.match(rep.metadata_http.msg, /unreachable/i, JSON.stringify(rep.metadata_http));
  });

  b.attack("a DNS look-up (getaddrinfo example.com) fails", async () => {
    const code = `${GUARD}
if GUARD:
    attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
    attempt("dns_host", lambda: socket.gethostbyname("example.com"))
# /etc/hosts of the sandbox still answers: name resolution itself works.
attempt("localhost", lambda: socket.getaddrinfo("localhost", 80, socket.AF_INET))
report(guard=GUARD, netns=NETNS)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assertGuard(rep);
    assertFailed(rep, "dns");
    assert.equal(rep.dns.exc, "gaierror", JSON.stringify(rep.dns));
    assertFailed(rep, "dns_host");
    assert.equal(rep.localhost.ok, true, `the resolver works for /etc/hosts: ${JSON.stringify(rep.localhost)}`);
  });

  b.attack("UDP to 127.0.0.1, ::1 and 8.8.8.8 fails with ENETUNREACH; host UDP listeners receive nothing", async () => {
    const u4 = await udpListener("udp4", "127.0.0.1");
    let u6 = null;
    try {
      u6 = await udpListener("udp6", "::1");
    } catch {
      u6 = null;
    }
    try {
      const code = `${GUARD}
attempt("udp4", lambda: udp("127.0.0.1", ${u4.address().port}))
attempt("udp6", lambda: udp("::1", ${u6 ? u6.address().port : 9}, socket.AF_INET6))
if GUARD:
    attempt("udp_external", lambda: udp("8.8.8.8", 53))
report(guard=GUARD, netns=NETNS)
`;
      const { result: r, report: rep } = await b.run(code);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assertGuard(rep);
      assertFailed(rep, "udp4", [ENETUNREACH]);
      assertFailed(rep, "udp6", [ENETUNREACH, EADDRNOTAVAIL]);
      assertFailed(rep, "udp_external", [ENETUNREACH]);
      assert.doesNotMatch(r.stdout, /SENT \d/);
      await udpSettled(u4, "udp4", "127.0.0.1");
      if (u6) await udpSettled(u6, "udp6", "::1");
      assert.equal(u4.received, 0, "the host UDP listener on 127.0.0.1 got a datagram");
      if (u6) assert.equal(u6.received, 0, "the host UDP listener on ::1 got a datagram");
    } finally {
      u4.close();
      u6?.close();
    }
  });

  b.attack("a host abstract unix socket is unreachable", async () => {
    const name = `ci-sec-abstract-${process.pid}-${Date.now()}`;
    const srv = createServer((sock) => {
      srv.accepted++;
      sock.destroy();
    });
    srv.accepted = 0;
    await new Promise((resolve, reject) => {
      srv.once("error", reject);
      srv.listen("\0" + name, resolve);
    });
    try {
      const code = `${GUARD}
def unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
        return "CONNECTED"
    finally:
        s.close()
attempt("abstract", lambda: unix("\\0${name}"))
report(guard=GUARD, netns=NETNS)
`;
      const { result: r, report: rep } = await b.run(code);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assertFailed(rep, "abstract", [ECONNREFUSED]);
      assert.equal(srv.accepted, 0, "the host's abstract socket got a connection");
    } finally {
      srv.close();
    }
  });

  b.attack("raw, packet and netlink sockets, and bringing up lo, are refused", async () => {
    const code = `${GUARD}
import fcntl, struct
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
def lo_up():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        # SIOCSIFFLAGS with IFF_UP: needs CAP_NET_ADMIN.
        return fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 1))
    finally:
        s.close()
attempt("lo_up", lo_up)
report(guard=GUARD, netns=NETNS)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assertFailed(rep, "raw", [EPERM]);
    assertFailed(rep, "packet", [EAFNOSUPPORT, EPERM]);
    assertFailed(rep, "netlink", [EAFNOSUPPORT]);
    assertFailed(rep, "lo_up", [EPERM]);
  });
});

b.finish();
