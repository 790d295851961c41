// Echo server and client for the compatibility matrix (tests/suites/compat_soft.sh, docs/compatibility.md).
// The JVM does socket I/O its own way: blocking java.net sockets go through poll() on a blocking fd with
// timeouts, NIO goes through epoll and nonblocking fds. Both must work unchanged under rdmasock.
//
//   java CompatEcho server blocking|nio HOST PORT
//       Echoes every byte of every connection back; when a client half-closes, the rest is flushed and the
//       connection closed. Prints "conn N: echoed B bytes" when one ends. Runs until killed.
//   java CompatEcho client blocking|nio HOST PORT CONNECTIONS BYTES SEED
//       Opens CONNECTIONS connections, sends BYTES pseudo-random bytes on each (from SEED and the connection
//       number), half-closes, reads the echo to EOF and compares length and SHA-256 with what was sent.
//       Prints one line per connection and "all N connections verified" on success; exits 1 otherwise.
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.SplittableRandom;
import java.util.concurrent.atomic.AtomicInteger;

public final class CompatEcho {
    private static final int CHUNK = 64 * 1024;

    public static void main(String[] args) throws Exception {
        if (args.length >= 4 && args[0].equals("server")) {
            InetSocketAddress where = new InetSocketAddress(args[2], Integer.parseInt(args[3]));
            if (args[1].equals("blocking")) {
                blockingServer(where);
                return;
            }
            if (args[1].equals("nio")) {
                nioServer(where);
                return;
            }
        } else if (args.length == 7 && args[0].equals("client")) {
            InetSocketAddress where = new InetSocketAddress(args[2], Integer.parseInt(args[3]));
            int connections = Integer.parseInt(args[4]);
            long bytes = Long.parseLong(args[5]);
            long seed = Long.parseLong(args[6]);
            boolean verified;
            if (args[1].equals("blocking")) {
                verified = blockingClient(where, connections, bytes, seed);
            } else if (args[1].equals("nio")) {
                verified = nioClient(where, connections, bytes, seed);
            } else {
                usage();
                return;
            }
            System.out.flush();
            System.exit(verified ? 0 : 1);
        }
        usage();
    }

    private static void usage() {
        System.err.println("usage: CompatEcho server blocking|nio HOST PORT\n"
                + "       CompatEcho client blocking|nio HOST PORT CONNECTIONS BYTES SEED");
        System.exit(2);
    }

    // ------------------------------------------------------------------ servers

    private static void blockingServer(InetSocketAddress where) throws IOException {
        AtomicInteger counter = new AtomicInteger();
        try (ServerSocket listener = new ServerSocket()) {
            listener.setReuseAddress(true);
            listener.bind(where, 64);
            System.out.println("listening (blocking) on " + where);
            System.out.flush();
            while (true) {
                Socket socket = listener.accept();
                int number = counter.incrementAndGet();
                Thread worker = new Thread(() -> echoBlocking(socket, number), "echo-" + number);
                worker.start();
            }
        }
    }

    private static void echoBlocking(Socket socket, int number) {
        long echoed = 0;
        try (Socket s = socket) {
            InputStream in = s.getInputStream();
            OutputStream out = s.getOutputStream();
            byte[] buffer = new byte[CHUNK];
            int n;
            while ((n = in.read(buffer)) > 0) {
                out.write(buffer, 0, n);
                echoed += n;
            }
            out.flush();
            s.shutdownOutput();
            report(number, echoed, null);
        } catch (IOException e) {
            report(number, echoed, e);
        }
    }

    private static synchronized void report(int number, long echoed, Exception error) {
        System.out.println("conn " + number + ": echoed " + echoed + " bytes"
                + (error == null ? "" : " then failed: " + error));
        System.out.flush();
    }

    /** One connection of the NIO server: bytes read but not yet written back wait in `pending`. */
    private static final class EchoState {
        final int number;
        final ByteBuffer pending = ByteBuffer.allocate(CHUNK);
        long echoed;
        boolean inputDone;

        EchoState(int number) {
            this.number = number;
        }
    }

    private static void nioServer(InetSocketAddress where) throws IOException {
        int counter = 0;
        try (Selector selector = Selector.open(); ServerSocketChannel listener = ServerSocketChannel.open()) {
            listener.setOption(java.net.StandardSocketOptions.SO_REUSEADDR, true);
            listener.bind(where, 64);
            listener.configureBlocking(false);
            listener.register(selector, SelectionKey.OP_ACCEPT);
            System.out.println("listening (nio) on " + where);
            System.out.flush();
            while (true) {
                selector.select();
                Iterator<SelectionKey> keys = selector.selectedKeys().iterator();
                while (keys.hasNext()) {
                    SelectionKey key = keys.next();
                    keys.remove();
                    if (!key.isValid())
                        continue;
                    if (key.isAcceptable()) {
                        SocketChannel channel;
                        while ((channel = listener.accept()) != null) {
                            channel.configureBlocking(false);
                            channel.register(selector, SelectionKey.OP_READ, new EchoState(++counter));
                        }
                        continue;
                    }
                    serveNio(key);
                }
            }
        }
    }

    private static void serveNio(SelectionKey key) {
        SocketChannel channel = (SocketChannel) key.channel();
        EchoState state = (EchoState) key.attachment();
        try {
            if (key.isReadable() && !state.inputDone && state.pending.hasRemaining()) {
                int n = channel.read(state.pending);
                if (n < 0)
                    state.inputDone = true;
                else
                    state.echoed += n;
            }
            state.pending.flip();
            channel.write(state.pending);
            state.pending.compact();
            boolean drained = state.pending.position() == 0;
            if (state.inputDone && drained) {
                channel.shutdownOutput();
                key.cancel();
                channel.close();
                report(state.number, state.echoed, null);
                return;
            }
            // Read only while there is room; ask for writability only while bytes wait: a full buffer must
            // stop reading (flow control), not spin.
            int interest = 0;
            if (!state.inputDone && state.pending.hasRemaining())
                interest |= SelectionKey.OP_READ;
            if (!drained)
                interest |= SelectionKey.OP_WRITE;
            key.interestOps(interest);
        } catch (IOException e) {
            key.cancel();
            try {
                channel.close();
            } catch (IOException ignored) {
                // Closing after a failure: the failure is what gets reported.
            }
            report(state.number, state.echoed, e);
        }
    }

    // ------------------------------------------------------------------ clients

    /** The bytes of one connection: reproducible from the seed, so sender and checker need not share state. */
    private static SplittableRandom streamFor(long seed, int connection) {
        return new SplittableRandom(seed * 1_000_003L + connection);
    }

    private static void fill(SplittableRandom random, byte[] chunk, int length) {
        for (int i = 0; i < length; i += 8) {
            long word = random.nextLong();
            for (int b = 0; b < 8 && i + b < length; b++)
                chunk[i + b] = (byte) (word >>> (8 * b));
        }
    }

    private static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private static String hex(byte[] digest) {
        StringBuilder text = new StringBuilder();
        for (byte b : digest)
            text.append(String.format("%02x", b & 0xff));
        return text.toString();
    }

    /** What one connection sent and got back. */
    private static final class Outcome {
        final int connection;
        long sent;
        long received;
        String sentDigest = "";
        String receivedDigest = "";
        String error;

        Outcome(int connection) {
            this.connection = connection;
        }

        boolean verified(long expected) {
            return error == null && sent == expected && received == expected && sentDigest.equals(receivedDigest);
        }
    }

    private static boolean summarize(List<Outcome> outcomes, long bytes) {
        boolean all = true;
        for (Outcome o : outcomes) {
            boolean ok = o.verified(bytes);
            all &= ok;
            System.out.println("conn " + o.connection + ": sent " + o.sent + " sha256 " + o.sentDigest
                    + ", received " + o.received + " sha256 " + o.receivedDigest
                    + (ok ? " ok" : " MISMATCH" + (o.error == null ? "" : " (" + o.error + ")")));
        }
        if (all)
            System.out.println("all " + outcomes.size() + " connections verified");
        return all;
    }

    private static boolean blockingClient(InetSocketAddress where, int connections, long bytes, long seed)
            throws InterruptedException {
        List<Outcome> outcomes = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        for (int c = 0; c < connections; c++) {
            Outcome outcome = new Outcome(c);
            outcomes.add(outcome);
            Thread t = new Thread(() -> runBlockingConnection(where, bytes, seed, outcome), "client-" + c);
            threads.add(t);
            t.start();
        }
        for (Thread t : threads)
            t.join();
        return summarize(outcomes, bytes);
    }

    private static void runBlockingConnection(InetSocketAddress where, long bytes, long seed, Outcome outcome) {
        try (Socket socket = new Socket()) {
            socket.connect(where, 10_000);
            socket.setSoTimeout(60_000);
            // The reader runs beside the writer: an echo server cannot take everything before answering.
            Thread writer = new Thread(() -> {
                try {
                    OutputStream out = socket.getOutputStream();
                    MessageDigest digest = sha256();
                    SplittableRandom random = streamFor(seed, outcome.connection);
                    byte[] chunk = new byte[CHUNK];
                    long left = bytes;
                    while (left > 0) {
                        int n = (int) Math.min(chunk.length, left);
                        // Vary the write sizes so message boundaries never line up with the chunk size.
                        n = Math.max(1, Math.min(n, 1 + random.nextInt(CHUNK)));
                        fill(random, chunk, n);
                        out.write(chunk, 0, n);
                        digest.update(chunk, 0, n);
                        outcome.sent += n;
                        left -= n;
                    }
                    out.flush();
                    socket.shutdownOutput();
                    outcome.sentDigest = hex(digest.digest());
                } catch (IOException e) {
                    outcome.error = "send: " + e;
                }
            });
            writer.start();
            MessageDigest digest = sha256();
            InputStream in = socket.getInputStream();
            byte[] buffer = new byte[CHUNK];
            int n;
            while ((n = in.read(buffer)) > 0) {
                digest.update(buffer, 0, n);
                outcome.received += n;
            }
            writer.join();
            outcome.receivedDigest = hex(digest.digest());
        } catch (IOException | InterruptedException e) {
            if (outcome.error == null)
                outcome.error = "receive: " + e;
        }
    }

    /** One connection of the NIO client. */
    private static final class ClientState {
        final Outcome outcome;
        final SplittableRandom random;
        final MessageDigest sentDigest = sha256();
        final MessageDigest receivedDigest = sha256();
        final ByteBuffer out = ByteBuffer.allocate(CHUNK);
        final ByteBuffer in = ByteBuffer.allocate(CHUNK);
        final byte[] scratch = new byte[CHUNK];
        long left;
        boolean outputDone;

        ClientState(Outcome outcome, long seed, long bytes) {
            this.outcome = outcome;
            this.random = streamFor(seed, outcome.connection);
            this.left = bytes;
            out.flip();
        }
    }

    private static boolean nioClient(InetSocketAddress where, int connections, long bytes, long seed)
            throws IOException {
        List<Outcome> outcomes = new ArrayList<>();
        int open = 0;
        long deadline = System.nanoTime() + 120_000_000_000L;
        try (Selector selector = Selector.open()) {
            for (int c = 0; c < connections; c++) {
                Outcome outcome = new Outcome(c);
                outcomes.add(outcome);
                SocketChannel channel = SocketChannel.open();
                channel.configureBlocking(false);
                // A nonblocking connect: EINPROGRESS first, then OP_CONNECT, exactly what the kernel reports.
                boolean connected = channel.connect(where);
                ClientState state = new ClientState(outcome, seed, bytes);
                channel.register(selector, connected ? SelectionKey.OP_READ | SelectionKey.OP_WRITE
                        : SelectionKey.OP_CONNECT, state);
                open++;
            }
            while (open > 0) {
                if (System.nanoTime() > deadline)
                    throw new IOException("no progress within 120 s");
                selector.select(1000);
                Iterator<SelectionKey> keys = selector.selectedKeys().iterator();
                while (keys.hasNext()) {
                    SelectionKey key = keys.next();
                    keys.remove();
                    if (stepNio(key))
                        open--;
                }
            }
        }
        return summarize(outcomes, bytes);
    }

    /** Moves one connection on; true when it has finished (verified or failed). */
    private static boolean stepNio(SelectionKey key) {
        SocketChannel channel = (SocketChannel) key.channel();
        ClientState state = (ClientState) key.attachment();
        Outcome outcome = state.outcome;
        try {
            if (key.isConnectable()) {
                channel.finishConnect();
                key.interestOps(SelectionKey.OP_READ | SelectionKey.OP_WRITE);
                return false;
            }
            if (key.isWritable() && !state.outputDone) {
                if (!state.out.hasRemaining() && state.left > 0) {
                    int n = (int) Math.min(CHUNK, state.left);
                    n = Math.max(1, Math.min(n, 1 + state.random.nextInt(CHUNK)));
                    fill(state.random, state.scratch, n);
                    state.sentDigest.update(state.scratch, 0, n);
                    state.out.clear();
                    state.out.put(state.scratch, 0, n);
                    state.out.flip();
                    state.left -= n;
                }
                outcome.sent += channel.write(state.out);
                if (!state.out.hasRemaining() && state.left == 0) {
                    channel.shutdownOutput();
                    state.outputDone = true;
                    outcome.sentDigest = hex(state.sentDigest.digest());
                    key.interestOps(SelectionKey.OP_READ);
                }
            }
            if (key.isReadable()) {
                state.in.clear();
                int n = channel.read(state.in);
                if (n < 0) {
                    outcome.receivedDigest = hex(state.receivedDigest.digest());
                    if (!state.outputDone)
                        outcome.error = "echo ended before the send did";
                    key.cancel();
                    channel.close();
                    return true;
                }
                state.receivedDigest.update(state.in.array(), 0, n);
                outcome.received += n;
            }
            return false;
        } catch (IOException e) {
            outcome.error = e.toString();
            key.cancel();
            try {
                channel.close();
            } catch (IOException ignored) {
                // Closing after a failure: the failure is what gets reported.
            }
            return true;
        }
    }

    private CompatEcho() {
    }
}
