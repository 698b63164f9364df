"""Writes bench/data/sample.json: the harness's small hand-written dataset.

    python bench/data/make_sample.py            # rewrites sample.json next to this file

All text is original. Each conversation is two named people chatting over several dated
sessions, with recurring topics (so several turns share the words a question uses) and
questions phrased differently from the turns that answer them. A turn is
``(speaker initial, text)`` or ``(speaker initial, text, tag)``; questions cite tags, which
become turn ids ``<conversation>-s<session>-t<turn>`` in the JSON.

Categories: ``single-hop`` (one turn answers it), ``multi-hop`` (evidence in two or more
sessions), ``temporal`` (the answer depends on when something was said: the session dates).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Turn = tuple[str, ...]

CONVERSATIONS: list[dict[str, Any]] = [
    {
        "id": "maya-jonas",
        "speakers": {"M": "Maya", "J": "Jonas"},
        "sessions": [
            ("2024-03-04T19:10:00", [
                ("M", "guess who just paid 45 euros to suffer for 21 kilometres", "race-signup"),
                ("J", "no way. the Riverside half? in June?"),
                ("M", "June 16th. I have three months to become a person who runs. my knee is "
                      "already complaining and I've done two jogs", "knee-1"),
                ("J", "ice it and don't be a hero. my advice as someone whose exercise is carrying "
                      "flour sacks"),
                ("M", "how's the bakery anyway"),
                ("J", "honestly I'm done with the 4am starts. I love the bread, I hate the alarm. "
                      "I keep looking at job ads at lunch", "bakery-doubt"),
                ("M", "you've said that since Christmas"),
                ("J", "I know. but this time I mean it. also Gerald is thriving, I fed him rye "
                      "flour and he doubled in four hours", "gerald"),
                ("M", "I still can't believe you named a sourdough starter Gerald", "gerald-name"),
                ("J", "he has a personality. unlike my van, which has started making a grinding "
                      "noise whenever I stop", "van-noise"),
                ("M", "that sounds expensive"),
                ("J", "it sounds like future me's problem"),
                ("M", "ok I'm going to stretch and pretend that counts as training"),
                ("J", "good luck, marathon girl"),
            ]),
            ("2024-03-19T20:30:00", [
                ("J", "big news. I handed in my notice at the bakery this morning", "notice"),
                ("M", "JONAS. finally. what did Frau Keller say"),
                ("J", "she was nice about it, she gave me a loaf to take home, which felt like "
                      "being dumped with a gift basket"),
                ("M", "so what's next, or are you going to live off Gerald"),
                ("J", "I start at Spoke & Chain on April 2nd. the bike repair place by the canal. "
                      "I've been fixing my own bikes for ten years, might as well get paid",
                 "bike-job"),
                ("M", "that's perfect for you honestly"),
                ("M", "my update is less exciting. the physio says my knee pain is actually my IT "
                      "band. I have to foam roll every night and it's medieval torture", "physio"),
                ("J", "how much did that cost you"),
                ("M", "60 for the session. cheaper than a new knee"),
                ("M", "oh and Lena and Tomás finally set a date. September 14th, in Lisbon. "
                      "and I'm maid of honour, so I have to give a speech", "wedding"),
                ("J", "you'll be great. just don't tell the story about the tent"),
                ("M", "the tent story is the best story I have"),
                ("J", "it is objectively the best story you have"),
            ]),
            ("2024-04-10T18:45:00", [
                ("M", "how was the first week with the bikes"),
                ("J", "amazing. someone brought in a tandem from the seventies with a bent rear "
                      "wheel and I trued it on day three. my boss looked impressed", "tandem"),
                ("M", "you sound happier than you have in a year"),
                ("J", "I am. waking up at 7:30 feels like a spa holiday"),
                ("M", "I ran 15 km on Sunday! slowly. but no knee pain, the foam roller is working",
                 "long-15"),
                ("J", "look at you. halfway to being unbearable about running"),
                ("J", "bad news on my side though, the garage finally looked at the van. "
                      "the grinding was the brake pads, completely worn down to the metal",
                 "brakes"),
                ("M", "ouch. how bad"),
                ("J", "240 euros for pads and discs. Gerald and I are eating plain bread "
                      "this month", "brakes-cost"),
                ("M", "I've started writing the wedding speech. I'm opening with Lena's camping "
                      "trip when the river rose and her tent floated off with her sleeping "
                      "bag inside", "speech"),
                ("J", "so the tent story. as predicted"),
                ("M", "it's a classic for a reason"),
            ]),
            ("2024-05-22T21:00:00", [
                ("M", "I did my longest run yesterday. 18 km along the river, then I lay on the "
                      "grass for twenty minutes", "long-18"),
                ("J", "respect. are you ready for the race"),
                ("M", "almost. I'm tapering now, which means shorter runs and lots of pasta",
                 "taper"),
                ("J", "pasta is the best part of any sport"),
                ("M", "also my fiddle leaf fig is dying. I moved it to the big window and it "
                      "dropped six leaves in a week", "fig"),
                ("J", "you're probably drowning it. water it once the top of the soil is dry, "
                      "not every day", "fig-advice"),
                ("M", "how do you know about plants"),
                ("J",
                 "Frau Keller had about forty of them in the shop window. I was on watering duty"),
                ("J", "work news: they asked me to run the rental fleet for the summer. "
                      "twenty city bikes and a cargo bike that everyone crashes", "rental"),
                ("M", "a promotion after seven weeks?"),
                ("J", "more like responsibility without a raise. but I'll take it"),
                ("J", "I'll be at the 15 km mark on race day with a sign", "sign"),
                ("M", "please make it embarrassing"),
            ]),
        ],
        "questions": [
            ("single-hop", "What is the name of Jonas's sourdough starter?",
             ["gerald", "gerald-name"]),
            ("single-hop", "How much was the entry fee for Maya's race?", ["race-signup"]),
            ("single-hop", "What did the physiotherapist say was causing Maya's knee pain?",
             ["physio"]),
            ("single-hop", "Where and when is Maya's sister getting married?", ["wedding"]),
            ("single-hop", "What old bicycle did Jonas repair in his first week at the new job?",
             ["tandem"]),
            ("single-hop", "Why was Maya's houseplant losing its leaves, according to Jonas?",
             ["fig", "fig-advice"]),
            ("single-hop", "What extra responsibility did Jonas get at work for the summer?",
             ["rental"]),
            ("multi-hop", "What was wrong with Jonas's vehicle and how much did fixing it cost?",
             ["van-noise", "brakes", "brakes-cost"]),
            ("multi-hop", "Why did Jonas leave the bakery and where did he go to work instead?",
             ["bakery-doubt", "notice", "bike-job"]),
            ("multi-hop", "How did Maya's knee trouble develop over her training?",
             ["knee-1", "physio", "long-15"]),
            ("multi-hop", "Which anecdote is Maya using in her maid of honour speech, "
                          "and had Jonas predicted it?", ["wedding", "speech"]),
            ("temporal", "How far was Maya's longest run in mid-April, and how far had she gone "
                         "by late May?", ["long-15", "long-18"]),
            ("temporal", "What did Jonas do at his job in the week after he started at the "
                         "repair shop?", ["tandem"]),
            ("temporal", "What was Jonas's big news in the second half of March?", ["notice"]),
            ("relative-time", "How far was Maya's longest run last month?", ["long-15"],
             "2024-05-10T12:00:00"),
        ],
    },
    {
        "id": "priya-sam",
        "speakers": {"P": "Priya", "S": "Sam"},
        "sessions": [
            ("2024-01-14T10:05:00", [
                ("S", "morning! so, Mum's 70th. we said we'd actually plan it this year instead of "
                      "panicking in March"),
                ("P", "yes. her birthday is March 23rd, a Saturday this year. I was thinking a "
                      "lunch rather than a party, she hates being the centre of attention",
                 "mum-bday"),
                ("S", "lunch is good. somewhere with a garden, she'd like that"),
                ("P", "I'll look around. I can't host, the kitchen is a building site",
                 "kitchen-1"),
                ("S", "how is the renovation going"),
                ("P", "slowly. the cabinets arrived in the wrong colour. we ordered sage green and "
                      "got something I can only describe as hospital mint", "cabinets"),
                ("S", "hospital mint lol"),
                ("P", "they're sending replacements in three weeks. until then we're cooking on a "
                      "camping stove in the dining room"),
                ("S", "I have news too. I'm adopting a dog. a retired racing greyhound, she's four "
                      "and her name is Biscuit", "biscuit"),
                ("P", "Sam!! you've wanted a dog forever"),
                ("S", "the shelter said greyhounds are basically 40 mph couch potatoes. "
                      "perfect for my flat"),
                ("P", "Arjun is going to lose his mind. can we meet her soon"),
                ("S", "she comes home on the 27th. come round the weekend after", "biscuit-date"),
            ]),
            ("2024-02-03T16:40:00", [
                ("P",
                 "we came by but you were out, Arjun left a drawing of Biscuit in your mailbox"),
                ("S",
                 "I found it! she has six legs in it, which is honestly accurate when she runs"),
                ("S", "she's settling in well. she sleeps about 20 hours a day and steals socks",
                 "biscuit-socks"),
                ("P", "typical. ok, I booked the Orchard House for Mum's lunch, the place with the "
                      "glass conservatory. table for twelve at 1pm", "venue"),
                ("S", "nice, that's the one near Aunt Rupa's old house?"),
                ("P", "yes. I asked them about a cake and they'll do a lemon drizzle if we tell "
                      "them by the 10th of March", "cake"),
                ("S", "Mum loves lemon drizzle. I'll organise a photo book from all of us, "
                      "I'll collect pictures from the cousins", "photo-book"),
                ("P", "great. Arjun got cast in the school play by the way. he's a tree",
                 "arjun-tree"),
                ("S", "a tree is a foundational role"),
                ("P", "he has one line. it's 'the wind is coming'. he practises it at dinner in a "
                      "very spooky voice", "arjun-line"),
                ("S", "I'm also going to start Japanese lessons. I finally booked the Osaka trip "
                      "for October", "japanese"),
                ("P", "that's brave. evening classes?"),
                ("S", "an app plus a Thursday class at the community college. I've learned to say "
                      "I am a cat"),
            ]),
            ("2024-02-25T20:15:00", [
                ("S", "progress on the kitchen?"),
                ("P", "the sage green cabinets are in and they look wonderful. but the plumber "
                      "found the old pipe under the sink was lead, so that's another bill",
                 "lead-pipe"),
                ("S", "oh no. how much"),
                ("P", "around 900 pounds to replace the run to the street. Dev from next door said "
                      "we were lucky to find out now", "pipe-cost"),
                ("S", "that's rough. on the bright side you'll have a proper kitchen for Easter"),
                ("P", "fingers crossed. how's the Japanese"),
                ("S", "I can order coffee and ask where the station is. my teacher says my "
                      "pronunciation is 'enthusiastic'"),
                ("S", "also Biscuit had a vet scare. she cut her paw on broken glass in the park "
                      "and needed three stitches", "biscuit-paw"),
                ("P", "poor girl! is she ok"),
                ("S", "she's wearing a cone and looking at me like I personally betrayed her"),
                ("P", "the photo book, did the cousins send pictures"),
                ("S", "most of them. I found one of Mum at our age on a scooter in Goa, it's going "
                      "on the cover", "cover-photo"),
                ("P", "she'll cry. in a good way"),
            ]),
            ("2024-04-07T11:30:00", [
                ("P", "I still can't stop thinking about the lunch. Mum said it was the best "
                      "birthday she'd had", "lunch-success"),
                ("S", "when she saw the scooter photo she laughed so hard she had to sit down",
                 "book-reaction"),
                ("P", "and the lemon drizzle was gone in ten minutes"),
                ("S", "Biscuit's stitches came out last week, she's back to zooming "
                      "around the field", "stitches-out"),
                ("P", "good. Arjun's play was on Thursday. he said the wind is coming so loudly a "
                      "kid in the front row cried", "play-night"),
                ("S", "a legendary tree"),
                ("P", "the kitchen is finally done too. we cooked a proper dal for the first time "
                      "since November", "kitchen-done"),
                ("S", "I'm coming over for that dal"),
                ("S", "Japanese update: I passed the first level test at the college with "
                      "82 percent", "jp-test"),
                ("P", "amazing! ready for Osaka?"),
                ("S", "ready to eat my way through Osaka. the talking part is still optional"),
            ]),
        ],
        "questions": [
            ("single-hop", "What kind of dog did Sam adopt and what is it called?", ["biscuit"]),
            ("single-hop", "What went wrong with the first delivery of Priya's kitchen units?",
             ["cabinets"]),
            ("single-hop", "What part did Priya's son get in the school play?", ["arjun-tree"]),
            ("single-hop", "Which restaurant did they book for their mother's lunch?", ["venue"]),
            ("single-hop", "What unexpected problem did the plumber discover in Priya's house?",
             ["lead-pipe"]),
            ("single-hop", "Which picture went on the front of the photo book?", ["cover-photo"]),
            ("single-hop", "What score did Sam get on his language exam?", ["jp-test"]),
            ("multi-hop", "How did Sam's greyhound get hurt and when was she fully recovered?",
             ["biscuit-paw", "stitches-out"]),
            ("multi-hop", "What was the plan for Mum's 70th birthday and how did it go?",
             ["mum-bday", "venue", "lunch-success"]),
            ("multi-hop", "Why is Sam learning Japanese and how is it going?",
             ["japanese", "jp-test"]),
            ("multi-hop", "What line did Arjun have in the play and what happened when he said "
                          "it on stage?", ["arjun-line", "play-night"]),
            ("temporal", "What was the state of Priya's kitchen at the end of February?",
             ["lead-pipe", "pipe-cost"]),
            ("temporal", "When was Biscuit due to come home from the shelter?", ["biscuit-date"]),
            ("temporal", "By what date did they have to order the cake for the birthday lunch?",
             ["cake"]),
            ("relative-time", "What state was Priya's kitchen in two weeks ago?",
             ["lead-pipe", "pipe-cost"], "2024-03-10T12:00:00"),
        ],
    },
    {
        "id": "lucia-ben",
        "speakers": {"L": "Lucia", "B": "Ben"},
        "sessions": [
            ("2024-06-02T13:20:00", [
                ("L", "I saw another flat today. it was advertised as cosy, which means the bed is "
                      "in the kitchen", "flat-1"),
                ("B", "classic. where was it"),
                ("L", "Elm Street, 1100 a month. the landlord wanted six months up "
                      "front. I said no", "elm"),
                ("B", "good. don't let them bully you, the market will calm down after the summer"),
                ("L", "I hope so. my lease ends August 31st and I'm starting to panic",
                 "lease-end"),
                ("B", "you can stay on my sofa for a bit if it comes to that. my band has a gig on "
                      "the 15th by the way, at the Copper Kettle", "gig-plan"),
                ("L", "I'll be there! are you still doing the cover of that sad country song"),
                ("B", "we dropped it. our drummer said it made people order fewer drinks"),
                ("L", "fair. book club is on the 9th, did you finish the novel"),
                ("B", "the lighthouse one? I'm on chapter four. I keep falling asleep, "
                      "it's very foggy", "book-progress"),
                ("L", "it's about grief, Ben, the fog is a metaphor"),
                ("B", "the fog is also a sedative", "sedative"),
            ]),
            ("2024-06-16T11:00:00", [
                ("L", "last night was SO good. the crowd actually danced", "gig-night"),
                ("B", "the sound guy said it was the busiest Saturday they'd had all year. "
                      "we got asked back for August", "gig-rebook"),
                ("L", "you deserve it. the new song about the night bus is my favourite"),
                ("B", "thanks. I wrote it on the night bus, so it's very authentic"),
                ("L", "I have to take Miso to the vet tomorrow. she's been sneezing for a week and "
                      "not eating her breakfast", "miso-sick"),
                ("B", "poor Miso. my allergist told me this week I'm allergic to cats, by the way, "
                      "so the sofa offer comes with antihistamines", "allergy"),
                ("L", "oh no. that complicates the emergency plan"),
                ("B", "I'll survive. I'll just sneeze in solidarity with Miso"),
                ("L", "book club was weird, nobody had finished the lighthouse novel except Greta, "
                      "and she hated it", "bookclub"),
                ("B", "so I'm not alone"),
                ("L", "next month we're reading a cookbook memoir, Greta's choice. I'm told it "
                      "has recipes"),
            ]),
            ("2024-07-01T19:30:00", [
                ("L", "Miso is better! the vet said it was a mild cat flu, she got antibiotics "
                      "and eye drops", "miso-vet"),
                ("B", "good news. and the vet bill?"),
                ("L", "120. she's now eating like a small lion, so worth it", "vet-cost"),
                ("B", "I've booked the hut in the Dolomites for the hiking weekend. July 19 to 21, "
                      "two bunks, shared kitchen", "hut-booking"),
                ("L", "yes! what do I need to bring"),
                ("B", "proper boots, a warm layer and a head torch. the hut switches the generator "
                      "off at ten", "packing"),
                ("L", "my boots are from school, they might fall apart"),
                ("B", "then buy new ones now and break them in. don't do what I did in Scotland "
                      "and walk on blisters for two days"),
                ("L", "flat news: I applied for a place on Birch Road. one bedroom, balcony, "
                      "950 a month and they allow cats", "birch-apply"),
                ("B", "a balcony for Miso! when do you hear back"),
                ("L", "the agent said by Friday. I've been checking my email every nine minutes"),
            ]),
            ("2024-07-21T21:40:00", [
                ("B", "back down. my legs are jelly"),
                ("L", "same. but the sunrise on Saturday from the ridge was the most beautiful "
                      "thing I've ever seen", "sunrise"),
                ("B", "worth the 5am start. the storm on Sunday less so", "storm"),
                ("L", "we were soaked through in ten minutes. at least my new boots held up",
                 "boots"),
                ("B", "you broke them in well. no blisters?"),
                ("L", "one tiny one. and I have other news. I got the Birch Road flat! I sign on "
                      "Tuesday and move on August 24th", "flat-got"),
                ("B", "LUCIA! balcony life"),
                ("L", "Miso is going to sit out there and judge the pigeons"),
                ("B", "I'll help you move. my allergy pills are on standby"),
                ("L", "you're a hero. I'll pay in pizza"),
                ("B", "and the Copper Kettle gig is confirmed for August 17th, come if you're not "
                      "buried in boxes", "gig-aug"),
            ]),
        ],
        "questions": [
            ("single-hop", "Why did Lucia turn down the Elm Street apartment?", ["elm"]),
            ("single-hop", "What did the vet diagnose Lucia's cat with?", ["miso-vet"]),
            ("single-hop", "What did Ben find out from his allergist?", ["allergy"]),
            ("single-hop", "What equipment did Ben say Lucia needed for the mountain trip?",
             ["packing"]),
            ("single-hop", "What was the best moment of the hiking weekend for Lucia?",
             ["sunrise"]),
            ("single-hop", "What was the weather like on the last day of the hike?", ["storm"]),
            ("single-hop", "What did Ben think of the lighthouse novel?",
             ["book-progress", "sedative"]),
            ("multi-hop", "How did Lucia's search for a new home end, and what features did the "
                          "place have?", ["birch-apply", "flat-got"]),
            ("multi-hop", "How did the band's June performance go and when are they playing "
                          "there again?", ["gig-night", "gig-rebook", "gig-aug"]),
            ("multi-hop", "What was wrong with Miso, what did the treatment cost, and did it work?",
             ["miso-sick", "miso-vet", "vet-cost"]),
            ("multi-hop", "Why might staying at Ben's place be a problem for Lucia's pet?",
             ["allergy", "gig-plan"]),
            ("temporal", "When does Lucia's current lease run out, and when is she moving into "
                         "the new flat?", ["lease-end", "flat-got"]),
            ("temporal", "What happened at the book club meeting in June?", ["bookclub"]),
            ("temporal", "What dates did Ben reserve the mountain hut for?", ["hut-booking"]),
            ("relative-time", "What happened at the book club last month?", ["bookclub"],
             "2024-07-05T12:00:00"),
        ],
    },
    {
        "id": "walter-nora",
        "speakers": {"W": "Walter", "N": "Nora"},
        "sessions": [
            ("2024-08-05T17:00:00", [
                ("N", "hi Grandpa! did the new phone arrive"),
                ("W", "It did. I am typing with one finger like a woodpecker. Your mother set it "
                      "up for me."),
                ("N", "you're doing great. how's the garden"),
                ("W", "The tomatoes are the best in years. I picked two kilos of the San Marzano "
                      "this morning and gave half to Mrs Okafor next door.", "tomatoes"),
                ("N", "save some for me! I'm revising all summer for my organic chemistry resit",
                 "resit"),
                ("W", "When is the exam?"),
                ("N", "September 2nd. I failed it by three marks in June and I'm still annoyed",
                 "resit-date"),
                ("W", "Three marks is nothing. Your grandmother failed her driving test twice and "
                      "became the best driver in the family."),
                ("N", "haha I didn't know that"),
                ("W", "The doctor wants to change my blood pressure tablets. The old ones make my "
                      "ankles swell.", "bp-1"),
                ("N", "that sounds sensible. when's the appointment"),
                ("W", "The 12th. Harold is driving me, then we are going to the chess club "
                      "afterwards.", "harold-drive"),
            ]),
            ("2024-08-19T16:30:00", [
                ("W", "Bad news from the garden. Blight on the tomatoes. Brown patches on the "
                      "leaves, and the fruit is going soft.", "blight"),
                ("N", "oh no, after such a good start"),
                ("W", "I pulled out eight plants and burned the leaves. Mrs Okafor lost hers too. "
                      "It was the wet week.", "blight-action"),
                ("N", "did you see the doctor"),
                ("W", "Yes. He gave me a new tablet, amlodipine replaced by something called "
                      "losartan. One in the morning. No more swollen ankles so far.", "bp-2"),
                ("N", "good! and you beat Harold at chess?"),
                ("W", "I did not. He played the same opening he has played since 1971 and I still "
                      "fell for it.", "chess-loss"),
                ("N", "classic Harold"),
                ("N", "I got a part-time job at the university library for the autumn, "
                      "shelving and the help desk, ten hours a week", "library-job"),
                ("W", "A library! You will read more than you shelve."),
                ("N", "that is the plan honestly"),
                ("W", "How is the revision going?"),
                ("N", "I finally understand reaction mechanisms. I drew them on the bathroom "
                      "mirror with a whiteboard pen", "mechanisms"),
            ]),
            ("2024-09-09T18:15:00", [
                ("N", "GRANDPA. I passed. 68 percent!", "passed"),
                ("W",
                 "I knew you would. I am very proud. Your grandmother would have made a cake."),
                ("N", "you can make the cake. the apple one"),
                ("W", "Deal. Come on Sunday. The apples are ready anyway, the old tree by the shed "
                      "has never given so many.", "apples"),
                ("N", "how are you feeling on the new tablets"),
                ("W", "A little dizzy when I stand up too fast. The nurse said to get up slowly "
                      "and drink more water.", "dizzy"),
                ("N", "please be careful on the stairs"),
                ("W", "I hold the rail like it owes me money."),
                ("N", "library started last week, I'm on the help desk on Tuesdays and Thursdays",
                 "library-start"),
                ("W", "Do people still ask for books, or only for the wifi password?"),
                ("N", "90 percent wifi password, 10 percent where is the toilet"),
                ("W", "Harold says hello. He is visiting his sister in Cornwall for two weeks, "
                      "so chess club is very quiet.", "harold-cornwall"),
            ]),
            ("2024-10-01T15:50:00", [
                ("W", "The apple cake was a success? You left very quickly."),
                ("N", "it was perfect, I had a seminar. I took two slices for my flatmates and "
                      "they're now your fans", "cake"),
                ("W", "Good. I have been clearing the vegetable beds for winter. Next year no "
                      "tomatoes in that corner because of the blight, I will put beans there.",
                 "beans"),
                ("N", "crop rotation, very professional"),
                ("W", "The dizziness is gone. The doctor checked my pressure last week and it was "
                      "128 over 80. He is pleased.", "bp-3"),
                ("N", "that's a great number!"),
                ("W", "Harold is back from Cornwall with a suntan and a new chess book. "
                      "I am worried.", "harold-back"),
                ("N", "you need to study the book too then"),
                ("W", "I will borrow it when he is asleep."),
                ("N", "I've been offered more hours at the library, fifteen a week from November. "
                      "I think I'll say yes", "more-hours"),
                ("W", "As long as your studies come first."),
            ]),
        ],
        "questions": [
            ("single-hop", "What variety of tomato was Walter growing?", ["tomatoes"]),
            ("single-hop", "Which medication did Walter's doctor switch him to?", ["bp-2"]),
            ("single-hop", "How did Nora finally get her head around reaction mechanisms?",
             ["mechanisms"]),
            ("single-hop", "What mark did Nora get in her chemistry retake?", ["passed"]),
            ("single-hop", "Where did Harold go on holiday?", ["harold-cornwall"]),
            ("single-hop", "What will Walter plant in the corner where the tomatoes were?",
             ["beans"]),
            ("multi-hop", "What happened to Walter's tomato crop over the summer?",
             ["tomatoes", "blight", "blight-action"]),
            ("multi-hop", "Why were Walter's blood pressure tablets changed, what side effect did "
                          "the new ones have, and how is his blood pressure now?",
             ["bp-1", "bp-2", "dizzy", "bp-3"]),
            ("multi-hop", "What does Nora do at her university job and how much is she working?",
             ["library-job", "library-start", "more-hours"]),
            ("multi-hop", "How did Nora's chemistry exam story turn out, from failing to "
                          "the result?", ["resit", "resit-date", "passed"]),
            ("temporal", "Who took Walter to his doctor's appointment in mid-August?",
             ["harold-drive"]),
            ("temporal", "What was Walter's blood pressure reading at the end of September?",
             ["bp-3"]),
            ("temporal", "What happened in the chess game Walter played right after his "
                         "doctor's visit?", ["chess-loss"]),
            ("relative-time", "What was Walter's blood pressure reading last week?", ["bp-3"],
             "2024-10-08T12:00:00"),
        ],
    },
    {
        "id": "dev-aisha",
        "speakers": {"D": "Dev", "A": "Aisha"},
        "sessions": [
            ("2024-10-12T20:00:00", [
                ("A", "pottery update: my first bowl survived the kiln. it's lopsided but it "
                      "holds soup", "bowl"),
                ("D", "a functional bowl! I want to see it"),
                ("A", "I'll bring it Sunday. how did the pitch go"),
                ("D", "the investors listened for forty minutes and asked about our churn rate "
                      "three times. no answer yet", "pitch-1"),
                ("A", "three times is either very good or very bad"),
                ("D", "that's what Karim said. we'll know in two weeks", "karim"),
                ("A", "car decision. I test drove both. the blue Golf has lower mileage but the "
                      "Corolla is hybrid and the seller knocked off 500", "cars"),
                ("D", "what's your gut saying"),
                ("A", "the Corolla. I drive to my grandmother's every weekend, "
                      "the fuel savings add up", "gut-corolla"),
                ("D", "then go with the Corolla. also my phone screen cracked again, I dropped it "
                      "on the tram steps", "phone-crack"),
                ("A", "Dev. that's the third time this year"),
                ("D", "I know. the case was in my bag, being useless"),
            ]),
            ("2024-10-27T19:10:00", [
                ("A", "I bought the Corolla! picked it up yesterday. it's silver and very sensible",
                 "car-bought"),
                ("D", "congrats!! road trip soon?"),
                ("A", "I drove Nani to the market this morning and she criticised my parking "
                      "the whole way", "nani-market"),
                ("D", "a true test of any car"),
                ("D", "the investors said yes. a seed round of 1.2 million, term sheet next week",
                 "seed"),
                ("A", "DEV. that's incredible. we need to celebrate"),
                ("D", "let's do our anniversary dinner at Saffron Room on November 9th, "
                      "I'll book it", "anniv-plan"),
                ("A", "yes. the tasting menu, no arguments"),
                ("A", "Nani finally gave me her recipe for the lamb biryani. she made me promise "
                      "not to tell my aunts", "biryani"),
                ("D", "a state secret"),
                ("A", "she measures in handfuls, so the recipe says things like 'one generous "
                      "handful of fried onions'", "handfuls"),
                ("D", "did you fix the phone"),
                ("A", "me? you mean did YOU fix the phone"),
                ("D", "yes sorry, I did. 89 at the repair kiosk, and a case I now actually use",
                 "phone-fix"),
            ]),
            ("2024-11-15T22:05:00", [
                ("A", "I still keep thinking about that dinner. the saffron ice cream!!",
                 "anniv-dinner"),
                ("D", "the waiter bringing a candle on the dessert because I told them it was our "
                      "fifth year", "fifth-year"),
                ("A", "you're a softie"),
                ("D", "the term sheet is signed. we can hire two engineers now. Karim is already "
                      "interviewing", "hiring"),
                ("A", "amazing. are you sleeping at all"),
                ("D", "five hours a night. I'll catch up in December"),
                ("A", "pottery class: I made a set of four mugs for Nani's 80th. glazed in green",
                 "mugs"),
                ("D", "she'll love that"),
                ("A", "the car made a weird beeping noise on the motorway. turned out I left the "
                      "parking brake half on. very embarrassing", "parking-brake"),
                ("D", "sensible silver car, not so sensible driver"),
                ("A", "don't"),
            ]),
            ("2024-12-03T18:40:00", [
                ("A", "Nani's 80th was lovely. she used the green mugs for chai straight away and "
                      "told everyone I made them", "nani-80"),
                ("D", "so you're officially a potter now"),
                ("A", "and my aunts recognised the biryani. I've been accused of being "
                      "the favourite", "biryani-reveal"),
                ("D", "you are the favourite"),
                ("D", "first engineer starts Monday. her name is Ines, she used to work on train "
                      "scheduling software", "ines"),
                ("A", "that's a cool background"),
                ("D", "Karim and I are going to Berlin for a conference the week before Christmas",
                 "berlin"),
                ("A", "bring me a Christmas market ornament"),
                ("D", "deal. and I'm being careful with the phone, zero drops since October"),
                ("A", "a Christmas miracle"),
            ]),
        ],
        "questions": [
            ("single-hop", "What was Aisha's first successful piece in her ceramics class?",
             ["bowl"]),
            ("single-hop", "What did the investors keep asking Dev about during the pitch?",
             ["pitch-1"]),
            ("single-hop", "How much funding did Dev's company raise?", ["seed"]),
            ("single-hop", "What was the strange noise from Aisha's car on the motorway?",
             ["parking-brake"]),
            ("single-hop", "What is special about how Nani's biryani recipe is written?",
             ["handfuls"]),
            ("single-hop", "What did Dev's first new hire do before joining?", ["ines"]),
            ("single-hop", "Where are Dev and Karim travelling before Christmas?", ["berlin"]),
            ("multi-hop", "Which car did Aisha choose, why, and what colour is it?",
             ["cars", "gut-corolla", "car-bought"]),
            ("multi-hop", "What happened to Dev's phone and how much did the repair cost?",
             ["phone-crack", "phone-fix"]),
            ("multi-hop", "What gift did Aisha make for her grandmother's birthday and how was "
                          "it received?", ["mugs", "nani-80"]),
            ("multi-hop", "How did Nani's secret recipe end up getting discovered by the aunts?",
             ["biryani", "biryani-reveal"]),
            ("multi-hop", "Where did Dev and Aisha celebrate their anniversary, "
                          "and which anniversary was it?",
             ["anniv-plan", "anniv-dinner", "fifth-year"]),
            ("temporal", "What did Aisha do with her new car the day after she picked it up?",
             ["nani-market"]),
            ("temporal", "What was happening with Dev's startup in mid-November?", ["hiring"]),
            ("relative-time", "What was going on with Dev's startup last week?", ["hiring"],
             "2024-11-21T12:00:00"),
        ],
    },
]


def build() -> dict[str, Any]:
    conversations: list[dict[str, Any]] = []
    questions: list[dict[str, Any]] = []
    for conv in CONVERSATIONS:
        tags: dict[str, str] = {}
        sessions: list[dict[str, Any]] = []
        for si, (date, turns) in enumerate(conv["sessions"], start=1):
            out_turns: list[dict[str, str]] = []
            for ti, turn in enumerate(turns, start=1):
                turn_id = f"{conv['id']}-s{si}-t{ti:02d}"
                out_turns.append({"id": turn_id, "speaker": conv["speakers"][turn[0]],
                                  "text": turn[1]})
                if len(turn) > 2:
                    assert turn[2] not in tags, f"duplicate tag {turn[2]}"
                    tags[turn[2]] = turn_id
            sessions.append({"id": f"s{si}", "date": date, "turns": out_turns})
        conversations.append({"id": conv["id"], "sessions": sessions})
        for category, question, evidence, *asked in conv["questions"]:
            missing = [t for t in evidence if t not in tags]
            assert not missing, f"{conv['id']}: unknown tags {missing}"
            if category == "multi-hop":  # evidence must span two or more sessions
                assert len({tags[t].rsplit("-t", 1)[0] for t in evidence}) >= 2, question
            entry = {"conversation": conv["id"], "question": question,
                     "evidence": [tags[t] for t in evidence], "category": category}
            if asked:  # a question asked at a moment: its time phrase counts back from there
                entry["date"] = asked[0]
            questions.append(entry)
    return {"conversations": conversations, "questions": questions}


def main() -> None:
    data = build()
    path = Path(__file__).with_name("sample.json")
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    turns = sum(len(s["turns"]) for c in data["conversations"] for s in c["sessions"])
    cats: dict[str, int] = {}
    for q in data["questions"]:
        cats[q["category"]] = cats.get(q["category"], 0) + 1
    print(f"{path}: {len(data['conversations'])} conversations, {turns} turns, "
          f"{len(data['questions'])} questions {cats}")


if __name__ == "__main__":
    main()
