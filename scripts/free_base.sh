# Sourced by the benchmark scripts (needs $PYTHON).
# free_base OFFSET...: a random base port P with every P+OFFSET free.
free_base() {
  "$PYTHON" - "$@" <<'PY'
import random, socket, sys
offsets = [int(o) for o in sys.argv[1:]]
def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port)); return True
        except OSError:
            return False
while True:
    base = random.randrange(30000, 60000)
    if all(free(base + off) for off in offsets):
        print(base); break
PY
}
