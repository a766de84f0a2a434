import boto3

from tests.fixtures.s3 import S3Bucket


def test_s3_bucket_fixture_reaches_moto_with_default_client(s3_bucket: S3Bucket) -> None:
    client = boto3.client("s3")  # only the environment the fixture set
    client.put_object(Bucket=s3_bucket.name, Key="a/b.txt", Body=b"hello")
    assert client.get_object(Bucket=s3_bucket.name, Key="a/b.txt")["Body"].read() == b"hello"
    assert s3_bucket.url == f"s3://{s3_bucket.name}"
    assert s3_bucket.endpoint_url.startswith("http://127.0.0.1:")


def test_s3_bucket_fixture_gives_each_test_a_fresh_bucket(s3_bucket: S3Bucket) -> None:
    listed = s3_bucket.client().list_objects_v2(Bucket=s3_bucket.name)
    assert listed.get("KeyCount", 0) == 0
