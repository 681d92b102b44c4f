"""A stateful Quix Streams application (run by tests/test_quix_streams.py with the Python of
the separate Quix venv, `.venv-quix`; it imports nothing of kafscale): counts the messages
per key of an input topic in its RocksDB state, whose changelog topic Quix Streams creates
with cleanup.policy=compact, and prints the counts it emitted as one JSON line.

    python quix_app.py BOOTSTRAP GROUP INPUT_TOPIC COUNT STATE_DIR
"""

import json
import sys

from quixstreams import Application


def main() -> None:
    bootstrap, group, input_topic, count, state_dir = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest", state_dir=state_dir,
                      use_changelog_topics=True)
    sdf = app.dataframe(app.topic(input_topic, key_deserializer="str", value_deserializer="json"))

    def count_per_key(value, state):
        n = state.get("n", 0) + 1
        state.set("n", n)
        return {"word": value["word"], "n": n}

    sdf.apply(count_per_key, stateful=True)
    print(json.dumps(app.run(count=count, timeout=60)), flush=True)


if __name__ == "__main__":
    main()
