"""The ClientApp: replies at once, with as many floats as it was sent."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


def _reply(msg: Message) -> Message:
    content = RecordDict({"metrics": MetricRecord({"num-examples": 1})})
    if "arrays" in msg.content.array_records:
        content["arrays"] = ArrayRecord(msg.content.array_records["arrays"].to_numpy_ndarrays())
    return Message(content=content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _reply(msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _reply(msg)
