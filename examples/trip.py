"""A trip booked as a saga: flight, hotel, car; the car fails, so the hotel and then the
flight are cancelled, each cancellation a durable step (docs/sagas.md).

    treadle run examples/trip.py:trip --input '{"trip_id": "T-1"}'

Each booking step registers its undo with ``saga.add`` once it succeeded. The car
rental refuses (``FatalError``: no retry), so the saga runs the undos in reverse order
and raises ``SagaCompensated``; the workflow catches it and reports what was undone.
A crash while compensating resumes the compensations where the log left them.
"""

from __future__ import annotations

from treadle import FatalError, Saga, SagaCompensated, Workflows

app = Workflows()


@app.step
async def book_flight(trip_id: str) -> str:
    return f"flight-{trip_id}"


@app.step
async def cancel_flight(booking: str) -> str:
    return f"cancelled {booking}"


@app.step
async def book_hotel(trip_id: str) -> str:
    return f"hotel-{trip_id}"


@app.step
async def cancel_hotel(booking: str) -> str:
    return f"cancelled {booking}"


@app.step(max_retries=0)
async def book_car(trip_id: str) -> str:
    raise FatalError(f"no car available for {trip_id}")


@app.step
async def cancel_car(booking: str) -> str:
    return f"cancelled {booking}"


@app.workflow
async def trip(trip_id: str = "T-1") -> dict[str, object]:
    saga = Saga()
    try:
        async with saga:
            flight = await book_flight(trip_id)
            saga.add(cancel_flight, flight)
            hotel = await book_hotel(trip_id)
            saga.add(cancel_hotel, hotel)
            car = await book_car(trip_id)
            saga.add(cancel_car, car)
    except SagaCompensated as failed:
        return {
            "trip_id": trip_id,
            "booked": False,
            "error": str(failed.error),
            "undo_failures": [name for name, _ in failed.compensation_errors],
        }
    return {"trip_id": trip_id, "booked": True, "bookings": [flight, hotel, car]}
