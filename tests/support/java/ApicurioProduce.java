// Produces records with Apicurio Registry's Java serializers (2.4) set to write Confluent's wire
// format: magic byte 0, the schema's 4-byte content id, then the payload; no Kafka headers.
// - avro: AvroKafkaSerializer, Avro binary; it registers SCHEMA_FILE itself through Apicurio's own
//   API (/apis/registry/v2).
// - json: JsonSchemaKafkaSerializer, JSON text; it cannot register JSON schemas (2.4), so it looks
//   up the latest version of artifact TOPIC-value, registered beforehand (SCHEMA_FILE unused).
// - protobuf: ProtobufKafkaSerializer with its own 2.4 defaults but headers off: magic byte 0, the
//   8-byte global id (DefaultIdHandler, use-id=globalId), Apicurio's length-delimited Ref message
//   naming the message type, then the Protobuf payload. SCHEMA_FILE is a serialized
//   FileDescriptorProto (importing google/protobuf/timestamp.proto) whose message "Order" is
//   written as a DynamicMessage; the serializer registers the file and its import itself.
// tests/support/apicurio.py compiles it with javac against tests/support/maven/apicurio-serdes.
//
// - with a last argument "headers" (avro, protobuf): the serializer with Apicurio 2.4's defaults,
//   headers on: the value bare (no magic byte, no id, no Ref), the 8-byte global id in the record
//   header apicurio.value.globalId, and apicurio.value.encoding (avro) or apicurio.value.msgType and
//   apicurio.protobuf.type (protobuf).
//
// - with an argument "keyed" (protobuf): the key is the same Order message, written by a second
//   ProtobufKafkaSerializer configured as a key serializer (artifact TOPIC-key; with headers on its
//   ids in apicurio.key.globalId and its name in apicurio.protobuf.type.key).
//
// java ApicurioProduce avro|json|protobuf BOOTSTRAP TOPIC REGISTRY_URL SCHEMA_FILE FIRST COUNT [headers] [keyed]
// writes records id FIRST .. FIRST+COUNT-1 (values below, derived from id) to partition 0 and
// prints one line per record: "offset id".
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.Timestamp;

public final class ApicurioProduce {
    private ApicurioProduce() {
    }

    public static void main(String[] args) throws Exception {
        boolean json = args[0].equals("json");
        boolean proto = args[0].equals("protobuf");
        String bootstrap = args[1], topic = args[2], registry = args[3];
        Schema schema = json || proto ? null : new Schema.Parser().parse(Files.readString(Path.of(args[4])));
        Descriptor order = null;
        if (proto) {
            FileDescriptorProto fdp = FileDescriptorProto.parseFrom(Files.readAllBytes(Path.of(args[4])));
            FileDescriptor file = FileDescriptor.buildFrom(fdp, new FileDescriptor[] {Timestamp.getDescriptor().getFile()});
            order = file.findMessageTypeByName("Order");
        }
        long first = Long.parseLong(args[5]);
        int count = Integer.parseInt(args[6]);
        List<String> flags = List.of(args).subList(7, args.length);
        boolean headers = flags.contains("headers");
        boolean keyed = proto && flags.contains("keyed");

        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("acks", "all");
        props.put("enable.idempotence", "false");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", json ? "io.apicurio.registry.serde.jsonschema.JsonSchemaKafkaSerializer"
                                    : proto ? "io.apicurio.registry.serde.protobuf.ProtobufKafkaSerializer"
                                           : "io.apicurio.registry.serde.avro.AvroKafkaSerializer");
        props.put("apicurio.registry.url", registry);
        props.put("apicurio.registry.auto-register", json ? "false" : "true");
        props.put("apicurio.registry.find-latest", json ? "true" : "false");
        if (!proto && !headers) {  // protobuf: 2.4's DefaultIdHandler (8 bytes) and use-id=globalId, its defaults
            props.put("apicurio.registry.as-confluent", "true");       // Legacy4ByteIdHandler: a 4-byte id
            props.put("apicurio.registry.use-id", "contentId");       // the id ccompat's /schemas/ids/{id} serves
        }
        // the id in the value, not in headers; or headers on (2.4's default), said outright
        props.put("apicurio.registry.headers.enabled", headers ? "true" : "false");
        if (keyed) {
            props.put("key.serializer", props.get("value.serializer"));
        }

        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<Object, Object> producer = new KafkaProducer<>(props)) {
            for (long id = first; id < first + count; id++) {
                Object value = json ? jsonRecord(id) : proto ? protoRecord(order, id) : record(schema, id);
                Object key = keyed ? value : "k" + id;
                sent.add(producer.send(new ProducerRecord<>(topic, 0, key, value)));
            }
            producer.flush();
            for (int i = 0; i < sent.size(); i++) {
                System.out.println(sent.get(i).get().offset() + " " + (first + i));
            }
        }
    }

    /** The record for ``id``: every value a function of it (tests/integration/test_apicurio.py
     * computes the same). Logical types are written as their Avro base values. */
    static GenericRecord record(Schema schema, long id) {
        GenericRecord r = new GenericData.Record(schema);
        r.put("id", id);
        r.put("name", "n" + id);
        List<String> tags = new ArrayList<>();
        for (long j = 0; j < id % 3; j++) {
            tags.add("t" + j);
        }
        r.put("tags", tags);
        r.put("coupon", id % 4 == 0 ? "C" + id : null);
        BigDecimal price = BigDecimal.valueOf(id * 100 + id % 100, 2);
        r.put("price", ByteBuffer.wrap(price.unscaledValue().toByteArray()));
        r.put("day", (int) (20454 + id));                  // 2026-01-01 + id days
        r.put("at", 1767225600000L + 1000 * id + 7);       // 2026-01-01T00:00:00Z + id s + 7 ms
        if (schema.getField("note") != null) {
            r.put("note", id % 2 == 1 ? "note" + id : null);
        }
        return r;
    }

    /** The JSON record for ``id`` (Jackson writes the map as a JSON object). */
    static Map<String, Object> jsonRecord(long id) {
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("id", id);
        r.put("name", "n" + id);
        List<String> tags = new ArrayList<>();
        for (long j = 0; j < id % 3; j++) {
            tags.add("t" + j);
        }
        r.put("tags", tags);
        r.put("coupon", id % 4 == 0 ? "C" + id : null);
        return r;
    }

    /** The Protobuf Order for ``id`` (tests/integration/test_apicurio.py computes the same): a nested
     * message, a repeated string, a map, an enum and a Timestamp. */
    static DynamicMessage protoRecord(Descriptor order, long id) {
        DynamicMessage.Builder b = DynamicMessage.newBuilder(order);
        b.setField(order.findFieldByName("id"), id);
        b.setField(order.findFieldByName("name"), "n" + id);
        Descriptor address = order.findFieldByName("address").getMessageType();
        b.setField(order.findFieldByName("address"), DynamicMessage.newBuilder(address)
                .setField(address.findFieldByName("city"), "c" + (id % 5))
                .setField(address.findFieldByName("zip"), (int) (id * 10)).build());
        for (long j = 0; j < id % 3; j++) {
            b.addRepeatedField(order.findFieldByName("tags"), "t" + j);
        }
        FieldDescriptor counts = order.findFieldByName("counts");
        Descriptor entry = counts.getMessageType();
        for (long j = 0; j <= id % 2; j++) {
            b.addRepeatedField(counts, DynamicMessage.newBuilder(entry)
                    .setField(entry.findFieldByName("key"), "k" + j)
                    .setField(entry.findFieldByName("value"), (int) (id + j)).build());
        }
        FieldDescriptor status = order.findFieldByName("status");
        b.setField(status, status.getEnumType().findValueByNumber((int) (id % 3)));
        b.setField(order.findFieldByName("at"),
                   Timestamp.newBuilder().setSeconds(1767225600L + id).setNanos(7000).build());
        return b.build();
    }
}
